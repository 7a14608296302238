// Checks of the variable-length strings in an HDF5 file's attributes and datasets before
// libhdf5 1.10.8 reads them (hdf5_checks.h).
#include "framework/experiment/hdf5_checks.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include <zlib.h>

#include "framework/core/error.h"
#include "framework/experiment/hdf5_object_header.h"
#include "framework/model/mapped_file.h"

namespace kvlab::hdf5 {

namespace {

uint64_t align8(uint64_t v) { return (v + 7) / 8 * 8; }

// The object `index` of the global heap collection at byte `addr`, walked as libhdf5 1.10.8
// deserialises it (H5HG__cache_heap_deserialize): objects {u16 index, u16 refcount, u32
// reserved, length, data padded to 8}; index 0 is free space, `length` bytes including its
// header; a tail shorter than an object header is free space too; a later object with the same
// index replaces an earlier one. Returns its length, or nothing when the collection has none.
std::optional<uint64_t> heap_object_size(const unsigned char* d, size_t n, uint64_t addr, size_t len_size,
                                         uint64_t index, const std::string& what) {
  const size_t header = 8 + len_size, object_header = 8 + len_size;
  if (addr > n || n - addr < header || std::memcmp(d + addr, "GCOL", 4) != 0 || d[addr + 4] != 1)
    fail(what, " points at a global heap collection at byte ", addr, " that the file does not hold (corrupt file?)");
  const uint64_t size = read_le(d + addr + 8, len_size);
  if (size < header || size > n - addr)
    fail(what, " points at a global heap collection at byte ", addr, " of ", size,
         " bytes, which the file does not hold (corrupt file?)");
  const uint64_t end = addr + size;
  std::optional<uint64_t> found;
  for (uint64_t p = addr + header; p < end;) {
    if (end - p < object_header) break;  // free space
    const uint64_t i = read_le(d + p, 2);
    const uint64_t bytes = read_le(d + p + 8, len_size);
    // libhdf5 steps by `bytes` over free space (a 0 would make it loop forever) and by the
    // padded data over an object; either must stay inside the collection.
    const uint64_t step = i == 0 ? bytes : (bytes > end ? end : object_header + align8(bytes));
    if (step == 0 || step > end - p)
      fail(what, " points into the global heap collection at byte ", addr, ", whose object ", i, " of ", bytes,
           " bytes does not fit it (corrupt file?)");
    if (i == index) found = bytes;
    p += step;
  }
  return found;
}

// The name of the file holding `obj` ("" when libhdf5 has none).
std::string file_name(hid_t obj) {
  std::string path;
  if (const ssize_t len = H5Fget_name(obj, nullptr, 0); len > 0) {
    path.resize(size_t(len) + 1);
    if (H5Fget_name(obj, path.data(), path.size()) < 0) path.clear();
    path.resize(std::min(path.size(), size_t(len)));
  }
  return path;
}

// The bytes of the file holding an open object, as the checks read them: mapped when libhdf5
// reads the file from disk, else copied (an in-memory image), with the sizes of offsets and
// lengths from its superblock at byte 0 (kvlab writes no user block) and base address 0.
struct FileImage {
  std::optional<MappedFile> map;
  std::vector<unsigned char> image;
  size_t off_size = 8, len_size = 8;

  const unsigned char* data() const {
    return map ? reinterpret_cast<const unsigned char*>(map->data()) : image.data();
  }
  size_t size() const { return map ? map->size() : image.size(); }

  static FileImage of(hid_t obj, const std::string& in) {
    FileImage f;
    const hid_t file = H5Iget_file_id(obj);
    const hid_t fapl = file < 0 ? -1 : H5Fget_access_plist(file);
    const bool on_disk = fapl >= 0 && H5Pget_driver(fapl) == H5FD_SEC2;
    if (!on_disk && file >= 0) {
      const ssize_t size = H5Fget_file_image(file, nullptr, 0);
      if (size > 0) {
        f.image.resize(size_t(size));
        if (H5Fget_file_image(file, f.image.data(), f.image.size()) != size) f.image.clear();
      }
    }
    if (fapl >= 0) H5Pclose(fapl);
    if (file >= 0) H5Fclose(file);
    if (on_disk) {
      f.map = MappedFile::open(file_name(obj));
    } else if (f.image.empty()) {
      fail(in, ": cannot read the file's bytes to check it");
    }
    const unsigned char* d = f.data();
    const size_t n = f.size();
    if (n < 40 || std::memcmp(d, "\x89HDF\r\n\x1a\n", 8) != 0)
      fail(in, ": the file does not start with an HDF5 superblock, which kvlab writes at byte 0");
    const unsigned sb = d[8];
    f.off_size = sb <= 1 ? d[13] : d[9];
    f.len_size = sb <= 1 ? d[14] : d[10];
    const size_t base_at = sb == 0 ? 24 : sb == 1 ? 28 : 12;
    if ((f.off_size != 2 && f.off_size != 4 && f.off_size != 8) ||
        (f.len_size != 2 && f.len_size != 4 && f.len_size != 8) || base_at + f.off_size > n ||
        read_le(d + base_at, f.off_size) != 0)
      fail(in, ": superblock sizes or base address kvlab does not write (corrupt file?)");
    return f;
  }
};

// One stored variable-length string {u32 length, heap collection offset, u32 object index}
// (HDF5 file format specification 3.0, IV.B, variable-length data): libhdf5 1.10.8 neither checks
// the index against the collection (an index past it: SEGV or an overlapping memcpy in
// H5HG_read) nor the length against the object (a claimed 4 GiB is allocated; a longer object is
// copied past the buffer), so both are compared here. A collection offset of 0 is a null string.
void check_string_value(const FileImage& file, const unsigned char* v, const std::string& what) {
  const uint64_t chars = read_le(v, 4), heap = read_le(v + 4, file.off_size);
  const uint64_t index = read_le(v + 4 + file.off_size, 4);
  if (heap == 0) return;  // a null string: libhdf5 reads nothing
  const std::optional<uint64_t> bytes = heap_object_size(file.data(), file.size(), heap, file.len_size, index, what);
  if (!bytes)
    fail(what, " names object ", index, " of the global heap collection at byte ", heap,
         ", which it does not hold (corrupt file?)");
  if (*bytes != chars) fail(what, " claims ", chars, " bytes; its global heap object holds ", *bytes, " (corrupt file?)");
}

// One filter of a filter pipeline message: its id and client values.
struct Filter {
  uint64_t id;
  std::vector<uint64_t> values;
};

// A filter pipeline message (IV.A.2.l): version 1 {1, n, 6 reserved; per filter u16 id, u16 name
// length, u16 flags, u16 value count, the name padded to 8, u32 values, 4 bytes of padding
// after an odd count} or 2 {2, n; per filter u16 id, u16 name length only for ids >= 256, u16
// flags, u16 value count, the name unpadded, u32 values}. Refused when its filters overrun it.
std::vector<Filter> read_pipeline(const unsigned char* b, uint64_t size, const std::string& in) {
  auto truncated = [&] { fail(in, ": its filter pipeline message overruns its ", size, " bytes (corrupt file?)"); };
  if (size < 2 || (b[0] != 1 && b[0] != 2)) fail(in, ": its filter pipeline message has a version libhdf5 does not write");
  const unsigned version = b[0], count = b[1];
  uint64_t p = version == 1 ? 8 : 2;
  std::vector<Filter> out;
  for (unsigned f = 0; f < count; ++f) {
    if (size - p < 2) truncated();
    Filter filter{read_le(b + p, 2), {}};
    p += 2;
    uint64_t name = 0;
    if (version == 1 || filter.id >= 256) {
      if (size - p < 2) truncated();
      name = read_le(b + p, 2);
      p += 2;
    }
    if (size - p < 4) truncated();
    const uint64_t values = read_le(b + p + 2, 2);
    p += 4;
    const uint64_t skip = version == 1 ? align8(name) : name;
    if (size - p < skip) truncated();
    p += skip;
    if ((size - p) / 4 < values) truncated();
    for (uint64_t v = 0; v < values; ++v, p += 4) filter.values.push_back(read_le(b + p, 4));
    if (version == 1 && values % 2 == 1) {
      if (size - p < 4) truncated();
      p += 4;
    }
    out.push_back(std::move(filter));
  }
  return out;
}

// Undoes the shuffle filter (H5Z_FILTER_SHUFFLE): it stores byte b of every element together,
// b = 0 .. element - 1, so stored[b * count + e] is element e's byte b.
std::vector<unsigned char> unshuffle(const std::vector<unsigned char>& stored, size_t element) {
  std::vector<unsigned char> out(stored.size());
  const size_t count = stored.size() / element;
  for (size_t b = 0; b < element; ++b)
    for (size_t e = 0; e < count; ++e) out[e * element + b] = stored[b * count + e];
  return out;
}
}  // namespace

// See hdf5_checks.h. The object header is read from the file's bytes: a version-1 object header
// (prefix: version 1, reserved, u16 message count, u32 reference count, u32 header size, padded
// to 16 bytes; messages {u16 type, u16 size, u8 flags, 3 reserved, body}; type 0x10 continues
// the header elsewhere {offset, length}); attribute messages (type 0x0C) of versions 1-3 (name,
// datatype and dataspace sizes, padded to 8 in version 1); a variable-length string datatype
// (class 9, type 1) whose values are {u32 length, heap collection offset, u32 object index}.
// (HDF5 file format specification 3.0, sections III.C, IV.A.1, IV.A.2.b/c/d/m.)
void check_string_attributes(hid_t attr, const std::string& what) {
  const std::string in = file_name(attr) + ": " + what;
  H5O_info_t info;
  if (H5Oget_info2(attr, &info, H5O_INFO_BASIC) < 0) fail(in, ": cannot locate its object header (corrupt file?)");
  const FileImage file = FileImage::of(attr, in);
  const unsigned char* d = file.data();
  const size_t n = file.size(), off_size = file.off_size, len_size = file.len_size;
  const uint64_t addr = info.addr;
  if (addr > n || n - addr < 16) fail(in, ": its object header at byte ", addr, " is past the end of the file");
  if (std::memcmp(d + addr, "OHDR", 4) == 0)
    fail(in, ": its object header is version 2, which kvlab does not write (a file kvlab did not write?)");
  if (d[addr] != 1) fail(in, ": its object header at byte ", addr, " has version ", unsigned(d[addr]), " (corrupt file?)");
  walk_object_header(d, n, addr, off_size, len_size, in, [&](uint64_t type, const unsigned char* b, uint64_t size,
                                                          unsigned flags) {
    if (type != 0x0C || size < 8 || b[0] < 1 || b[0] > 3) return;
    // Attribute message. Shared datatypes or messages live elsewhere: kvlab writes neither.
    const unsigned version = b[0];
    const unsigned attr_flags = version == 1 ? 0 : b[1];
    if ((flags & 0x02) || (attr_flags & 0x03))
      fail(in, ": the object has a shared attribute or datatype, which kvlab does not write (corrupt file?)");
    const uint64_t name_size = read_le(b + 2, 2), dt_size = read_le(b + 4, 2), ds_size = read_le(b + 6, 2);
    auto pad = [&](uint64_t v) { return version == 1 ? align8(v) : v; };
    const uint64_t dt = (version == 3 ? 9 : 8) + pad(name_size), ds = dt + pad(dt_size), data = ds + pad(ds_size);
    if (data > size || dt_size < 8) return;  // libhdf5 refuses this message when it decodes it
    const unsigned char* t = b + dt;
    const bool vlen_string = (t[0] & 0x0f) == 9 && (t[1] & 0x0f) == 1;
    if (vlen_string) {
      const uint64_t element = read_le(t + 4, 4);
      if (element != 4 + off_size + 4)
        fail(in, ": a variable-length string attribute of the object stores ", element, "-byte values, not ",
             4 + off_size + 4, " (corrupt file?)");
      // Dataspace: version 1 {version, rank, flags, reserved 5, dims} or 2 {version, rank,
      // flags, type (0 scalar, 1 simple, 2 null), dims}; lengths of len_size bytes.
      const unsigned char* s = b + ds;
      if (ds_size < 8) fail(in, ": an attribute's dataspace is truncated (corrupt file?)");
      const unsigned rank = s[1];
      const uint64_t dims_at = s[0] == 1 ? 8 : 4;
      uint64_t count = s[0] == 2 && s[3] == 2 ? 0 : 1;
      if (dims_at + uint64_t(rank) * len_size > ds_size) fail(in, ": an attribute's dataspace is truncated (corrupt file?)");
      for (unsigned r = 0; r < rank; ++r) {
        const uint64_t dim = read_le(s + dims_at + r * len_size, len_size);
        if (dim != 0 && count > (size - data) / dim) {
          count = UINT64_MAX;
          break;
        }
        count *= dim;
      }
      if (count > (size - data) / element)
        fail(in, ": an attribute's values overrun its message (corrupt file?)");
      for (uint64_t e = 0; e < count; ++e)
        check_string_value(file, b + data + e * element, in + ": a string value of the object");
    }
  });
}

namespace {

// Calls on_chunk(offset, bytes) for every stored chunk of the chunked dataset `dset` whose
// elements are `element` bytes as stored, with the chunk's bytes after the filters it went
// through are undone: the pipeline kvlab writes (shuffle, deflate), or part of it, as the
// dataset's filter pipeline message says (libhdf5 unshuffles by the element size stored there;
// a chunk's filter mask says which filters it skipped, bit i: filter i). A chunk that does not
// come out as exactly its chunk's bytes is refused: libhdf5 1.10.8 copies a whole chunk out of
// whatever its filters returned (fuzz_results, ASan heap-buffer-overflow in H5VM_memcpyvv under
// H5D__select_read: a float chunk that inflated short). Returns the elements per chunk.
template <class OnChunk>
uint64_t for_each_stored_chunk(hid_t dset, const FileImage& file, const std::string& in, uint64_t element,
                               const char* values, OnChunk&& on_chunk) {
  struct Id {  // closes a libhdf5 identifier however this ends
    hid_t id;
    herr_t (*close)(hid_t);
    ~Id() {
      if (id >= 0) close(id);
    }
  };
  const Id space{H5Dget_space(dset), H5Sclose};
  const int rank = space.id < 0 ? -1 : H5Sget_simple_extent_ndims(space.id);
  if (rank < 0) fail(in, ": its dataspace is unreadable (corrupt file?)");
  std::vector<hsize_t> chunk(static_cast<size_t>(rank));
  const Id dcpl{H5Dget_create_plist(dset), H5Pclose};  // the chunk dimensions
  if (dcpl.id < 0 || H5Pget_layout(dcpl.id) != H5D_CHUNKED || H5Pget_chunk(dcpl.id, rank, chunk.data()) != rank)
    fail(in, ": its ", values, " are not stored in chunks, as kvlab stores them (corrupt file?)");
  H5O_info_t info;
  if (H5Oget_info2(dset, &info, H5O_INFO_BASIC) < 0) fail(in, ": cannot locate its object header (corrupt file?)");
  std::vector<Filter> pipeline;
  walk_object_header(file.data(), file.size(), info.addr, file.off_size, file.len_size, in,
                     [&](uint64_t type, const unsigned char* body, uint64_t size, unsigned) {
                       if (type == 0x0B) pipeline = read_pipeline(body, size, in);
                     });
  bool shuffle = false, deflate = false;
  const int filters = int(pipeline.size());
  for (int i = 0; i < filters; ++i) {
    const Filter& f = pipeline[size_t(i)];
    // libhdf5 stores the shuffle without its element size for a variable-length type, and then
    // skips it (optional) on every chunk it writes: kvlab's string chunks are deflated only.
    if (f.id == H5Z_FILTER_SHUFFLE && i == 0 && (f.values.empty() || (f.values.size() == 1 && f.values[0] == element))) {
      shuffle = true;
    } else if (f.id == H5Z_FILTER_DEFLATE && i == filters - 1 && !deflate) {
      deflate = true;
    } else {
      fail(in, ": its ", values, " pass through filter ", f.id, " at position ", i, " (", f.values.size(),
           " values), which kvlab does not write (corrupt file?)");
    }
  }
  // A chunk may be larger than the file (deflated); each is bounded when it is inflated below.
  uint64_t chunk_elements = 1;
  for (const hsize_t c : chunk) {
    if (c == 0 || chunk_elements > (uint64_t(1) << 40) / c) fail(in, ": its chunks are too large (corrupt file?)");
    chunk_elements *= c;
  }
  if (element == 0 || chunk_elements > (uint64_t(1) << 40) / element) fail(in, ": its chunks are too large (corrupt file?)");
  const uint64_t chunk_bytes = chunk_elements * element;

  hsize_t chunks = 0;
  if (H5Dget_num_chunks(dset, space.id, &chunks) < 0) fail(in, ": its chunk index is unreadable (corrupt file?)");
  std::vector<hsize_t> offset(static_cast<size_t>(rank));
  for (hsize_t c = 0; c < chunks; ++c) {
    unsigned mask = 0;
    haddr_t addr = 0;
    hsize_t stored = 0;
    if (H5Dget_chunk_info(dset, space.id, c, offset.data(), &mask, &addr, &stored) < 0)
      fail(in, ": its chunk index is unreadable (corrupt file?)");
    if (addr > file.size() || stored > file.size() - addr)
      fail(in, ": a chunk at byte ", addr, " of ", stored, " bytes runs past the end of the file (corrupt file?)");
    const bool inflate = deflate && !(mask & (1u << (filters - 1)));
    const bool unshuffled = shuffle && !(mask & 1u);
    if (unshuffled && pipeline[0].values.size() != 1)
      fail(in, ": a chunk at byte ", addr, " went through the shuffle filter without an element size (corrupt file?)");
    std::vector<unsigned char> bytes(file.data() + addr, file.data() + addr + stored);
    if (inflate) {
      // deflate expands at most ~1032:1 (zlib's technical details): a larger claim is corrupt,
      // and refused before its buffer is allocated.
      uLongf out = uLongf(chunk_bytes);
      std::vector<unsigned char> raw(chunk_bytes <= 1100 * stored + 64 ? chunk_bytes : 0);
      if (raw.empty() || uncompress(raw.data(), &out, bytes.data(), uLong(stored)) != Z_OK || out != chunk_bytes)
        fail(in, ": a chunk at byte ", addr, " does not inflate to its ", chunk_bytes, " bytes (corrupt file?)");
      bytes = std::move(raw);
    }
    if (bytes.size() != chunk_bytes)
      fail(in, ": a chunk at byte ", addr, " holds ", bytes.size(), " bytes, not its ", chunk_bytes, " (corrupt file?)");
    if (unshuffled) bytes = unshuffle(bytes, element);
    on_chunk(offset, bytes);
  }
  return chunk_elements;
}

}  // namespace

// See hdf5_checks.h. kvlab writes a string dataset chunked, through the shuffle and deflate
// filters (results.cpp); the values are read from each chunk's stored bytes (located through
// libhdf5's chunk index, H5Dget_chunk_info), undoing the filters the chunk went through, and
// checked as check_string_attributes checks an attribute's.
void check_string_dataset(hid_t dset, const std::string& what) {
  const std::string in = file_name(dset) + ": " + what;
  const hid_t space = H5Dget_space(dset);
  const int rank = space < 0 ? -1 : H5Sget_simple_extent_ndims(space);
  const hssize_t points = space < 0 ? -1 : H5Sget_simple_extent_npoints(space);
  std::vector<hsize_t> dims(static_cast<size_t>(std::max(rank, 0)));
  if (rank >= 0) H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  if (space >= 0) H5Sclose(space);
  if (rank < 0 || points < 0) fail(in, ": its dataspace is unreadable (corrupt file?)");
  if (points == 0) return;  // libhdf5 reads no value
  const FileImage file = FileImage::of(dset, in);
  const size_t element = 4 + file.off_size + 4;  // libhdf5's stored size of a string (H5T__vlen_set_loc)
  std::vector<hsize_t> chunk;
  {
    const hid_t dcpl = H5Dget_create_plist(dset);
    chunk.resize(dims.size());
    if (dcpl >= 0) {
      H5Pget_chunk(dcpl, rank, chunk.data());
      H5Pclose(dcpl);
    }
  }
  uint64_t stored_values = 0;  // in-extent values of the stored chunks
  std::vector<hsize_t> local(dims.size());
  for_each_stored_chunk(dset, file, in, element, "strings",
                        [&](const std::vector<hsize_t>& offset, const std::vector<unsigned char>& bytes) {
    // The chunk's elements in row-major order; those past the dataset's extent (an edge chunk)
    // are not read by libhdf5.
    std::fill(local.begin(), local.end(), 0);
    const uint64_t chunk_elements = bytes.size() / element;
    for (uint64_t e = 0; e < chunk_elements; ++e) {
      bool inside = true;
      for (int r = 0; r < rank; ++r) inside &= offset[r] + local[r] < dims[r];
      if (inside) {
        check_string_value(file, bytes.data() + e * element, in + ": a string value");
        ++stored_values;
      }
      for (int r = rank - 1; r >= 0 && ++local[r] == chunk[r]; --r) local[r] = 0;
    }
  });
  // kvlab writes every string of a dataset, so each lies in a stored chunk. A dataset whose
  // chunks are missing would read as empty strings, and its extent is then bounded by nothing in
  // the file (fuzz_results, libFuzzer out-of-memory: 2.2 GB of string pointers for a dataset of
  // no stored chunks): refused.
  if (stored_values != uint64_t(points))
    fail(in, ": it holds ", points, " strings, of which its chunks store ", stored_values,
         " (kvlab stores every one; corrupt file?)");
}

// See hdf5_checks.h.
void check_chunk_sizes(hid_t dset, uint64_t element_bytes, const std::string& what) {
  const std::string in = file_name(dset) + ": " + what;
  const FileImage file = FileImage::of(dset, in);
  for_each_stored_chunk(dset, file, in, element_bytes, "values",
                        [](const std::vector<hsize_t>&, const std::vector<unsigned char>&) {});
}

}  // namespace kvlab::hdf5
