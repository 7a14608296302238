// The results reader's limits (results_read_checks.h): why each one exists is said beside it.
#include "framework/experiment/results_read_checks.h"

#include "framework/core/error.h"

namespace kvlab::results_detail {

// The size of the file holding `obj` (0 when HDF5 cannot tell).
uint64_t file_bytes_of(hid_t obj) {
  const hid_t f = H5Iget_file_id(obj);
  hsize_t size = 0;
  if (f >= 0) {
    if (H5Fget_filesize(f, &size) < 0) size = 0;
    H5Fclose(f);
  }
  return size;
}

// "PATH: " of the file holding `obj` (errors found below the guarded() layer name the file).
std::string file_prefix(hid_t obj) {
  const ssize_t len = H5Fget_name(obj, nullptr, 0);
  if (len <= 0) return "";
  std::string name(size_t(len) + 1, '\0');
  if (H5Fget_name(obj, name.data(), name.size()) < 0) return "";
  name.resize(size_t(len));
  return name + ": ";
}

// Element counts come from the file's dataspaces: they are checked against what the file can
// hold before a vector is sized from them. Attribute data is stored uncompressed (each element
// at least one byte of the file); dataset chunks may be deflated, and deflate expands at most
// ~1032:1, so a dataset may hold up to 1100 bytes per file byte (+1 MiB for fill values).
void check_elements(uint64_t n, uint64_t bytes_per_file_byte, uint64_t slack_bytes, hid_t obj,
                    const std::string& what) {
  const uint64_t file_bytes = file_bytes_of(obj);
  if (n > file_bytes * bytes_per_file_byte + slack_bytes)
    fail(file_prefix(obj), what, " claims ", n, " elements, more than the file's ", file_bytes,
         " bytes can hold (corrupt file?)");
}

// libhdf5 1.10.8 builds a chunk record (~150 bytes) for every chunk of the extent a read covers,
// stored or not (fuzz_results, libFuzzer OOM: 16,515,071 elements in 2-element chunks in a 132 KB
// file, allowed by check_elements, made 8.3M records, 1.2 GB). kvlab stores every chunk, each at
// least a 24-byte B-tree entry: an extent of more than file bytes / 16 (+4096) chunks is refused.
bool check_chunks(const H5::DataSet& in, const std::vector<hsize_t>& dims, const std::string& what) {
  const hid_t plist = H5Dget_create_plist(in.getId());
  if (plist < 0) fail(file_prefix(in.getId()), what, " has an unreadable creation property list (corrupt file?)");
  std::vector<hsize_t> chunk(dims.size(), 0);
  const bool chunked = H5Pget_layout(plist) == H5D_CHUNKED;
  const int chunk_rank = chunked ? H5Pget_chunk(plist, int(chunk.size()), chunk.data()) : 0;
  H5Pclose(plist);
  if (!chunked) return false;
  if (chunk_rank != int(dims.size()))
    fail(file_prefix(in.getId()), what, " has chunks of rank ", chunk_rank, " for ", dims.size(), " dimensions (corrupt file?)");
  const uint64_t limit = file_bytes_of(in.getId()) / 16 + 4096;
  uint64_t chunks = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (chunk[i] == 0) fail(file_prefix(in.getId()), what, " has a chunk dimension of 0 (corrupt file?)");
    const uint64_t along = dims[i] / chunk[i] + (dims[i] % chunk[i] != 0);
    if (along != 0 && chunks > limit / along)
      fail(file_prefix(in.getId()), what, " spans more than ", limit, " chunks, more than the file's ",
           file_bytes_of(in.getId()), " bytes can index (corrupt file?)");
    chunks *= along;
  }
  // ... and unstored chunks read as fill values, so no storage bounds an extent of them
  // (fuzz_results, libFuzzer OOM at 2.5 GB RSS): every chunk must be stored, as kvlab writes them.
  hsize_t stored = 0;
  const H5::DataSpace space = in.getSpace();  // (H5S_ALL fails in libhdf5 1.10.8; its own extent counts all)
  if (H5Dget_num_chunks(in.getId(), space.getId(), &stored) < 0)
    fail(file_prefix(in.getId()), what, " has an unreadable chunk index (corrupt file?)");
  if (stored != chunks)
    fail(file_prefix(in.getId()), what, " stores ", stored, " of the ", chunks, " chunks its extent spans (corrupt file?)");
  return true;
}

// A variable-length string type from the file must have 1-byte characters. libhdf5 1.10.8
// trusts the stored character size: with 0, H5T__conv_vlen passes no buffer to the heap read, and
// H5HG_read allocates the string itself and the pointer is lost inside libhdf5 (fuzz_results:
// LeakSanitizer, 211 bytes from H5HG_read). Nothing kvlab can free afterwards, so it is refused
// before the read.
void check_string_type(hid_t obj, hid_t type, const std::string& what) {
  const htri_t variable = H5Tis_variable_str(type);
  if (variable < 0) fail(file_prefix(obj), what, " has an unreadable string type (corrupt file?)");
  if (!variable) return;
  const hid_t chars = H5Tget_super(type);
  const size_t size = chars < 0 ? 0 : H5Tget_size(chars);
  if (chars >= 0) H5Tclose(chars);
  if (size != 1)
    fail(file_prefix(obj), what, " is a variable-length string of ", size, "-byte characters, not 1 (corrupt file?)");
}

}  // namespace kvlab::results_detail
