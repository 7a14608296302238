// Checks of an HDF5 file's own bytes before libhdf5 1.10.8 trusts them (hdf5_checks.h).
#include "framework/experiment/hdf5_checks.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <unordered_set>
#include <utility>
#include <vector>

#include <zlib.h>

#include "framework/core/error.h"
#include "framework/model/mapped_file.h"

namespace kvlab::hdf5 {

namespace fs = std::filesystem;

namespace {

uint64_t read_le(const unsigned char* p, size_t bytes) {
  uint64_t v = 0;
  for (size_t k = 0; k < bytes; ++k) v |= uint64_t(p[k]) << (8 * k);
  return v;
}

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

// An attribute message (IV.A.2.m): version 1 {1, reserved, u16 name, datatype and dataspace
// sizes, each part padded to 8}, 2 {2, flags, the three sizes, unpadded} or 3 {as 2, then the
// name's character set}, then the name, datatype, dataspace and data. libhdf5 1.10.8 decodes the
// parts by their sizes without comparing them with the message's (fuzz_results, ASan
// heap-buffer-overflow in H5O__msg_iterate_real under H5Aexists), so they must fit it.
void check_attribute_fits(const unsigned char* body, uint64_t size, const std::string& in, uint64_t header) {
  if (size < 8 || body[0] < 1 || body[0] > 3) return;  // libhdf5 refuses these itself
  const uint64_t name = read_le(body + 2, 2), type = read_le(body + 4, 2), space = read_le(body + 6, 2);
  auto pad = [&](uint64_t v) { return body[0] == 1 ? (v + 7) / 8 * 8 : v; };
  const uint64_t parts = (body[0] == 3 ? 9 : 8) + pad(name) + pad(type) + pad(space);
  if (parts > size)
    fail(in, ": the object header at byte ", header, " has an attribute message whose name, datatype and dataspace (",
         parts, " bytes with its header) do not fit its ", size, " bytes (corrupt file?)");
  // The name is copied with strdup: it must end inside its `name` bytes (the size counts the
  // terminating NUL; fuzz_results, ASan heap-buffer-overflow in strdup under H5Aexists).
  const unsigned char* text = body + (body[0] == 3 ? 9 : 8);
  if (std::memchr(text, 0, name) == nullptr)
    fail(in, ": the object header at byte ", header, " has an attribute message whose name does not end within its ",
         name, " bytes (corrupt file?)");
}

// The version-1 object header at `addr`: its chunks (chunk 0 after the 16-byte prefix, then each
// continuation message's {offset, length}) as libhdf5 1.10.8 loads them, calling
// on_message(type, body, size) for every message; a chunk running past the file is refused
// naming `in` (libhdf5 allocates a chunk's claimed length before comparing it with the file's
// end: found by fuzz_results, H5C_protect asked for ~8 EiB). A header that is not version 1 or
// lies outside the file is left to libhdf5, which refuses it.
template <class OnMessage>
void walk_object_header(const unsigned char* d, size_t n, uint64_t addr, size_t off_size, size_t len_size,
                        const std::string& in, OnMessage&& on_message) {
  if (addr > n || n - addr < 16 || d[addr] != 1) return;
  std::vector<std::pair<uint64_t, uint64_t>> chunks{{addr + 16, read_le(d + addr + 8, 4)}};
  for (size_t c = 0; c < chunks.size(); ++c) {
    const auto [start, length] = chunks[c];
    if (start > n || length > n - start)
      fail(in, ": the object header at byte ", addr, " has a chunk of ", length, " bytes at byte ", start,
           ", past the end of the ", n, "-byte file (corrupt file?)");
    // An empty chunk: libhdf5 1.10.8 asks H5MM_malloc for 0 bytes, gets NULL, fails the open and
    // leaks the header image it had read (LeakSanitizer, 56 bytes from H5FL_blk_malloc at H5Fopen,
    // fuzz_results: a continuation of length 0). libhdf5 never writes one: a chunk holds messages.
    if (length == 0)
      fail(in, ": the object header at byte ", addr, " has a chunk of 0 bytes at byte ", start,
           ", which libhdf5 does not write (corrupt file?)");
    for (uint64_t p = start; length - (p - start) >= 8;) {
      const uint64_t type = read_le(d + p, 2), size = read_le(d + p + 2, 2);
      const uint64_t body = p + 8;
      if (size > start + length - body) break;  // libhdf5 refuses the header itself
      // libhdf5 writes version-1 messages padded to 8 bytes and decodes a continuation's 16 bytes
      // whatever its size says; on such a header it fails and leaks the chunk it was decoding
      // (LeakSanitizer, 56 bytes from H5FL_blk_malloc at H5Fopen: a continuation of size 0).
      if (size % 8 != 0 || (type == 0x10 && size != off_size + len_size))
        fail(in, ": the object header at byte ", addr, " has a message of type ", type, " and ", size,
             " bytes at byte ", p, ", which libhdf5 does not write (corrupt file?)");
      if (type == 0x10) {
        if (chunks.size() == 4096) fail(in, ": an object header continues more than 4096 times (corrupt file?)");
        chunks.emplace_back(read_le(d + body, off_size), read_le(d + body + off_size, len_size));
      }
      if (type == 0x0C) check_attribute_fits(d + body, size, in, addr);
      on_message(type, d + body, size, d[p + 4]);
      p = body + size;
    }
  }
}

// A data layout message (IV.A.2.i) as libhdf5 1.10.8 writes it by default: version 3, class 0
// (compact), 1 (contiguous) or 2 (chunked: dimensionality k of 2..33 for a dataset of rank k - 1,
// then the B-tree address and k u32 sizes, each at least 1). libhdf5 decodes the dataset's filter
// pipeline message before its layout and, when the layout then fails to decode or its chunk
// sizes fail H5D__chunk_init, returns without freeing what it had read (LeakSanitizer under
// H5Dopen2 -> H5D__layout_oh_read: 128 bytes of pipeline at a layout of version 0, found by
// fuzz_results; 4.3 KB of chunk cache in an earlier campaign). So anything else is refused first.
void check_layout(const unsigned char* body, uint64_t size, size_t off_size, const std::string& in, uint64_t header) {
  auto refuse = [&](const auto&... why) {
    fail(in, ": the object header at byte ", header, " has a data layout message ", why...,
         ", which libhdf5 does not write (corrupt file?)");
  };
  if (size < 2 || body[0] != 3) refuse("of version ", size < 1 ? 0u : unsigned(body[0]));
  if (body[1] > 2) refuse("of class ", unsigned(body[1]));
  if (body[1] != 2) return;
  const uint64_t k = size >= 3 ? body[2] : 0;
  if (k < 2 || k > 33 || size < 3 + off_size + 4 * k) refuse("of ", k, " chunk dimensions in ", size, " bytes");
  for (uint64_t i = 0; i < k; ++i)
    if (read_le(body + 3 + off_size + 4 * i, 4) == 0) refuse("whose chunk size ", i, " is 0");
}

// The number of elements of a dataspace message (IV.A.2.b): version 1 {1, rank, flags, 5 reserved,
// rank sizes} or 2 {2, rank, flags, type: 0 scalar, 1 simple, 2 null; rank sizes}, each size
// `len_size` bytes; rank 0 is a scalar (1 element). Nothing when the message is too short or the
// count exceeds the file's bytes (no dataset of the file could hold it: refused by the caller).
std::optional<uint64_t> dataspace_elements(const unsigned char* body, uint64_t size, size_t len_size, uint64_t n) {
  const unsigned version = body[0], rank = body[1];
  if (version == 2 && size >= 4 && body[3] == 2) return 0;
  const uint64_t dims = version == 1 ? 8 : 4;
  if ((version != 1 && version != 2) || size < dims + uint64_t(rank) * len_size) return std::nullopt;
  uint64_t elements = 1;
  for (unsigned i = 0; i < rank; ++i) {
    const uint64_t dim = read_le(body + dims + i * len_size, len_size);
    if (dim != 0 && elements > (n + 1) / dim) return n + 1;
    elements *= dim;
  }
  return elements;
}

// Sizes of offsets and lengths and where the root group's symbol table entry starts, from a
// version 0 or 1 superblock at byte 0 (what libhdf5 writes by default, and kvlab); nothing for
// a later superblock (checksummed: libhdf5 refuses a corrupt one) or a file too short for one.
struct Superblock {
  size_t off_size = 0, len_size = 0;
  uint64_t root_entry = 0;
};
std::optional<Superblock> read_superblock(const unsigned char* d, size_t n) {
  if (n < 16 || std::memcmp(d, "\x89HDF\r\n\x1a\n", 8) != 0 || d[8] > 1) return std::nullopt;
  Superblock s{d[13], d[14], 0};
  if ((s.off_size != 2 && s.off_size != 4 && s.off_size != 8) || (s.len_size != 2 && s.len_size != 4 && s.len_size != 8))
    return std::nullopt;
  // Version 0: 24 bytes of versions, sizes and B-tree Ks (version 1: 4 more), then the base,
  // free-space, end-of-file and driver-block addresses, then the root group's entry.
  s.root_entry = (d[8] == 0 ? 24 : 28) + 4 * s.off_size;
  if (s.root_entry + 2 * s.off_size + 24 > n) return std::nullopt;
  return s;
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

// libhdf5 1.10 trusts the object sizes inside a global heap collection (where variable-length
// strings live): a corrupt size makes H5HG_read copy past the collection (found by
// fuzz_results: a 262,144-byte object in a 4,096-byte collection). Before HDF5 reads the file,
// every collection ("GCOL", version 1, its size, then objects {u16 index, u16 refcount, u32
// reserved, length size, data padded to 8}; index 0 is the free space ending it) is checked to
// hold its objects. Collections are found by their signature, each skipped as a whole once
// checked (so string data inside one is never taken for a header).
void check_global_heaps(const fs::path& path) {
  const MappedFile map = MappedFile::open(path);
  const auto* d = reinterpret_cast<const unsigned char*>(map.data());
  const size_t n = map.size();
  // Size of lengths from a version 0/1 (byte 14) or 2/3 (byte 10) superblock at offset 0.
  if (n < 16 || std::memcmp(d, "\x89HDF\r\n\x1a\n", 8) != 0) return;
  const size_t len_size = d[8] <= 1 ? d[14] : d[10];
  if (len_size != 2 && len_size != 4 && len_size != 8) return;  // HDF5 itself refuses these
  auto read_len = [&](size_t at) {
    uint64_t v = 0;
    for (size_t k = 0; k < len_size; ++k) v |= uint64_t(d[at + k]) << (8 * k);
    return v;
  };
  const size_t header = 8 + len_size;  // signature, version, 3 reserved, collection size
  for (size_t at = 0; at + header <= n;) {
    const void* hit = memmem(d + at, n - at, "GCOL", 4);
    if (!hit) break;
    const size_t start = size_t(static_cast<const unsigned char*>(hit) - d);
    if (start + header > n || d[start + 4] != 1 || d[start + 5] || d[start + 6] || d[start + 7]) {
      at = start + 4;
      continue;
    }
    const uint64_t size = read_len(start + 8);
    if (size < header || size > n - start) {
      at = start + 4;  // not a collection this file could hold: HDF5 refuses it on its own
      continue;
    }
    const size_t end = start + size;
    for (size_t p = start + header; p + 8 + len_size <= end;) {
      const unsigned index = d[p] | unsigned(d[p + 1]) << 8;
      if (index == 0) break;  // free space: the rest of the collection
      const uint64_t bytes = read_len(p + 8);
      const uint64_t padded = bytes > end ? bytes : (bytes + 7) / 8 * 8;
      if (padded > end - (p + 8 + len_size))
        fail(path.string(), ": corrupt HDF5 global heap at byte ", start, ": object ", index, " of ", bytes,
             " bytes does not fit its ", size, "-byte collection");
      p += 8 + len_size + padded;
    }
    at = end;
  }
}

// See hdf5_checks.h. The group structure kvlab writes (HDF5 file format specification 3.0:
// II.A superblock, III.A.1 version-1 B-trees, III.B symbol table nodes, III.D local heaps,
// IV.A.1 version-1 object headers, IV.A.2.r symbol table message): the root group's symbol table
// entry {name offset, object header address, cache type, reserved, scratch}; a group's object
// header holds a symbol table message {B-tree address, local heap address}; the group B-tree
// ("TREE", node type 0, level, entries used, siblings, then keys and children interleaved) leads
// at level 0 to symbol table nodes ("SNOD", version 1, reserved, u16 symbols, entries as the
// root's), whose entries are the group's members; a local heap ("HEAP", version 0, reserved 3,
// data segment size, free-list offset, data segment address) holds the members' names. A chunked
// dataset's layout message (IV.A.2.i, version 3, class 2: dimensionality k, B-tree address, ...)
// leads to a B-tree of node type 1 whose keys are {u32 chunk bytes, u32 filter mask, k u64
// offsets} and whose level-0 children are the chunks: libhdf5 allocates a chunk's claimed size
// before reading it (a 4 GiB malloc in H5Dread, fuzz_results).
void check_object_headers(const fs::path& path) {
  const MappedFile map = MappedFile::open(path);
  const auto* d = reinterpret_cast<const unsigned char*>(map.data());
  const size_t n = map.size();
  const std::optional<Superblock> sb = read_superblock(d, n);
  if (!sb) return;
  const size_t off = sb->off_size, len = sb->len_size;
  const std::string in = path.string();
  auto fits = [&](uint64_t at, uint64_t bytes) { return at <= n && bytes <= n - at; };
  auto check_heap = [&](uint64_t at) {
    if (!fits(at, 8 + 2 * len + off) || std::memcmp(d + at, "HEAP", 4) != 0 || d[at + 4] != 0) return;
    const uint64_t size = read_le(d + at + 8, len), data = read_le(d + at + 8 + 2 * len, off);
    if (!fits(data, size))
      fail(in, ": the local heap at byte ", at, " claims ", size, " bytes at byte ", data, ", past the end of the ",
           n, "-byte file (corrupt file?)");
  };
  struct Tree {
    uint64_t at;
    unsigned type;  // 0 a group's B-tree, 1 a chunked dataset's
    uint64_t key;   // bytes per key
    // A chunked dataset without a filter pipeline: the bytes each chunk must hold (its
    // dimensions times the element size); 0 when filtered (a chunk's stored size then varies).
    uint64_t unfiltered_chunk_bytes = 0;
  };
  std::vector<uint64_t> headers{read_le(d + sb->root_entry + off, off)}, nodes;
  std::vector<Tree> trees;
  if (read_le(d + sb->root_entry + 2 * off, 4) == 1) {  // cached symbol table: {B-tree, heap}
    trees.push_back({read_le(d + sb->root_entry + 2 * off + 8, off), 0, len});
    check_heap(read_le(d + sb->root_entry + 3 * off + 8, off));
  }
  std::unordered_set<uint64_t> seen;
  // Every structure is visited once; a file of n bytes holds at most n / 16 of them.
  auto first_visit = [&](uint64_t at) { return seen.size() <= n / 16 && seen.insert(at).second; };
  while (!headers.empty() || !trees.empty() || !nodes.empty()) {
    if (!headers.empty()) {
      const uint64_t at = headers.back();
      headers.pop_back();
      if (!first_visit(at)) continue;
      std::optional<Tree> chunked;
      bool filtered = false;
      std::optional<unsigned> rank, chunk_rank;  // the dataspace's, and the chunked layout's dimensionality - 1
      bool datatype = false, layout = false;
      // A chunked layout's element size (its last dimension) and whether a chunk reaches 4 GiB.
      std::optional<uint64_t> chunk_element;
      bool chunk_too_large = false;
      // A compact or contiguous dataset's elements, element size, stored bytes and (contiguous) address.
      std::optional<uint64_t> elements, element_bytes, stored, contiguous_at;
      walk_object_header(d, n, at, off, len, in, [&](uint64_t type, const unsigned char* body, uint64_t size, unsigned) {
        datatype |= type == 0x03;
        layout |= type == 0x08;
        if (type == 0x08) check_layout(body, size, off, in, at);
        if (type == 0x01 && size >= 2) {
          rank = body[1];  // dataspace {version, rank, ...}
          elements = dataspace_elements(body, size, len, n);
        }
        if (type == 0x03 && size >= 8) element_bytes = read_le(body + 4, 4);  // datatype {class, bits, u32 size}
        if (type == 0x08 && body[1] == 2) chunk_rank = body[2] - 1u;
        if (type == 0x08 && body[1] == 0 && size >= 4) stored = read_le(body + 2, 2);  // compact {3, 0, u16 size}
        if (type == 0x08 && body[1] == 1 && size >= 2 + off + len) {  // contiguous {3, 1, address, size}
          stored = read_le(body + 2 + off, len);
          contiguous_at = read_le(body + 2, off);
        }
        if (type == 0x11 && size >= 2 * off) {  // symbol table message: the object is a group
          trees.push_back({read_le(body, off), 0, len});
          check_heap(read_le(body + off, off));
        } else if (type == 0x08 && size >= 3 + off && body[0] == 3 && body[1] == 2) {  // chunked layout
          // {version 3, class 2, dimensionality k, B-tree address, k u32 sizes: the chunk's
          // dimensions, then the element size in bytes}
          const uint64_t k = body[2];
          chunked = Tree{read_le(body + 3, off), 1, 8 + 8 * k};
          if (size >= 3 + off + 4 * k) {
            uint64_t bytes = 1;
            for (uint64_t i = 0; i < k && bytes != 0; ++i) {
              const uint64_t dim = read_le(body + 3 + off + 4 * i, 4);
              bytes = dim != 0 && bytes <= n / dim ? bytes * dim : 0;  // 0: no such chunk fits the file
            }
            chunked->unfiltered_chunk_bytes = bytes;
            chunk_element = read_le(body + 3 + off + 4 * (k - 1), 4);
            uint64_t chunk_bytes = 1;
            for (uint64_t i = 0; i < k && !chunk_too_large; ++i) {
              chunk_bytes *= read_le(body + 3 + off + 4 * i, 4);
              chunk_too_large = chunk_bytes >= (uint64_t(1) << 32);
            }
          }
        } else if (type == 0x0B) {  // filter pipeline
          filtered = true;
        }
      });
      // libhdf5 takes an object with a datatype and a dataspace for a dataset (H5O__dset_isa) and,
      // when it has no layout, leaks the pipeline it read first (fuzz_results, 128 bytes, as above).
      if (rank && datatype && !layout)
        fail(in, ": the object header at byte ", at, " describes a dataset without a data layout message (corrupt file?)");
      // libhdf5 1.10.8 copies a compact or contiguous dataset's whole extent out of its stored
      // bytes without comparing the two (fuzz_results, ASan SEGV in H5VM_memcpyvv under
      // H5D__contig_read: a compact dataset whose stored size was 0).
      const bool allocated = !contiguous_at || *contiguous_at != ~uint64_t(0) >> (64 - 8 * off);
      if (stored && allocated && elements && element_bytes &&
          (*element_bytes == 0 || *elements > n / *element_bytes || *stored != *elements * *element_bytes))
        fail(in, ": the object header at byte ", at, " describes a dataset of ", *elements, " elements of ",
             *element_bytes, " bytes stored in ", *stored, " bytes (corrupt file?)");
      if (contiguous_at && allocated && !fits(*contiguous_at, *stored))
        fail(in, ": the object header at byte ", at, " has its data at byte ", *contiguous_at, ", ", *stored,
             " bytes past the end of the ", n, "-byte file (corrupt file?)");
      if (rank && chunk_rank && *rank != *chunk_rank)
        fail(in, ": the object header at byte ", at, " describes a dataset of rank ", *rank, " stored in chunks of rank ",
             *chunk_rank, " (corrupt file?)");
      // libhdf5 1.10.8 allocates a chunked dataset's chunk cache, then fails H5D__chunk_init on
      // a chunk of 4 GiB or more (its elements' size is the datatype's, not the layout's) and
      // leaks the cache and the pipeline (fuzz_results, LeakSanitizer 4.2 KB + 128 B under
      // H5Dopen2 -> H5D__layout_oh_read: a datatype of 2 GiB elements). libhdf5 writes the
      // datatype's size as the layout's last dimension, so the two must agree.
      if (chunk_element && element_bytes && *chunk_element != *element_bytes)
        fail(in, ": the object header at byte ", at, " describes elements of ", *element_bytes,
             " bytes stored in chunks of ", *chunk_element, "-byte elements (corrupt file?)");
      if (chunk_too_large)
        fail(in, ": the object header at byte ", at, " describes chunks of 4 GiB or more, which libhdf5 refuses (corrupt file?)");
      if (chunked) {
        if (filtered) chunked->unfiltered_chunk_bytes = 0;
        trees.push_back(*chunked);
      }
    } else if (!trees.empty()) {
      const Tree t = trees.back();
      const uint64_t at = t.at;
      trees.pop_back();
      if (!first_visit(at) || !fits(at, 8 + 2 * off) || std::memcmp(d + at, "TREE", 4) != 0 || d[at + 4] != t.type)
        continue;
      const unsigned level = d[at + 5];
      const uint64_t entries = read_le(d + at + 6, 2);
      for (uint64_t i = 0; i < entries; ++i) {
        const uint64_t key = at + 8 + 2 * off + i * (t.key + off), child = key + t.key;
        if (!fits(child, off)) break;
        const uint64_t address = read_le(d + child, off);
        if (level > 0) {
          trees.push_back({address, t.type, t.key, t.unfiltered_chunk_bytes});
        } else if (t.type == 0) {
          nodes.push_back(address);
        } else if (const uint64_t bytes = read_le(d + key, 4); !fits(address, bytes)) {
          fail(in, ": a dataset chunk at byte ", address, " claims ", bytes, " bytes, past the end of the ", n,
               "-byte file (corrupt file?)");
        } else if (t.unfiltered_chunk_bytes != 0 && bytes != t.unfiltered_chunk_bytes) {
          // libhdf5 1.10.8 reads an unfiltered chunk's stored bytes into a buffer of that size and
          // copies a whole chunk out of it (fuzz_results, ASan heap-buffer-overflow in
          // H5VM_memcpyvv under H5Dread: a deflated chunk whose pipeline message was gone).
          fail(in, ": a dataset chunk at byte ", address, " holds ", bytes, " bytes where its unfiltered dataset's chunks hold ",
               t.unfiltered_chunk_bytes, " (corrupt file?)");
        }
      }
    } else {
      const uint64_t at = nodes.back();
      nodes.pop_back();
      if (!first_visit(at) || !fits(at, 8) || std::memcmp(d + at, "SNOD", 4) != 0 || d[at + 4] != 1) continue;
      const uint64_t symbols = read_le(d + at + 6, 2), entry = 2 * off + 24;
      for (uint64_t i = 0; i < symbols && fits(at + 8 + i * entry, entry); ++i) {
        const unsigned char* e = d + at + 8 + i * entry;
        headers.push_back(read_le(e + off, off));
        if (read_le(e + 2 * off, 4) == 1) {  // a member group with its symbol table cached
          trees.push_back({read_le(e + 2 * off + 8, off), 0, len});
          check_heap(read_le(e + 3 * off + 8, off));
        }
      }
    }
  }
}

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

// See hdf5_checks.h. kvlab writes a string dataset chunked, through the shuffle and deflate
// filters (results.cpp); the values are read from each chunk's stored bytes (located through
// libhdf5's chunk index, H5Dget_chunk_info), undoing the filters the chunk went through, and
// checked as check_string_attributes checks an attribute's.
void check_string_dataset(hid_t dset, const std::string& what) {
  const std::string in = file_name(dset) + ": " + what;
  struct Id {  // closes a libhdf5 identifier however this ends
    hid_t id;
    herr_t (*close)(hid_t);
    ~Id() {
      if (id >= 0) close(id);
    }
  };
  const Id space{H5Dget_space(dset), H5Sclose};
  const int rank = space.id < 0 ? -1 : H5Sget_simple_extent_ndims(space.id);
  const hssize_t points = space.id < 0 ? -1 : H5Sget_simple_extent_npoints(space.id);
  if (rank < 0 || points < 0) fail(in, ": its dataspace is unreadable (corrupt file?)");
  if (points == 0) return;  // libhdf5 reads no value
  std::vector<hsize_t> dims(static_cast<size_t>(rank)), chunk(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(space.id, dims.data(), nullptr);
  const Id dcpl{H5Dget_create_plist(dset), H5Pclose};  // the chunk dimensions
  if (dcpl.id < 0 || H5Pget_layout(dcpl.id) != H5D_CHUNKED || H5Pget_chunk(dcpl.id, rank, chunk.data()) != rank)
    fail(in, ": its strings are not stored in chunks, as kvlab stores them (corrupt file?)");

  const FileImage file = FileImage::of(dset, in);
  const size_t element = 4 + file.off_size + 4;  // libhdf5's stored size of a string (H5T__vlen_set_loc)
  // The pipeline kvlab writes (shuffle, deflate), or part of it, as the dataset's filter pipeline
  // message says (libhdf5 unshuffles by the element size stored there); a chunk's filter mask
  // says which filters it skipped (bit i: filter i).
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
      fail(in, ": its strings pass through filter ", f.id, " at position ", i, " (", f.values.size(),
           " values), which kvlab does not write (corrupt file?)");
    }
  }
  uint64_t chunk_elements = 1;
  for (const hsize_t c : chunk) {
    if (c == 0 || chunk_elements > file.size() / c) fail(in, ": its chunks are larger than the file (corrupt file?)");
    chunk_elements *= c;
  }
  const uint64_t chunk_bytes = chunk_elements * element;

  hsize_t chunks = 0;
  if (H5Dget_num_chunks(dset, space.id, &chunks) < 0) fail(in, ": its chunk index is unreadable (corrupt file?)");
  std::vector<hsize_t> offset(static_cast<size_t>(rank)), local(static_cast<size_t>(rank));
  uint64_t stored_values = 0;  // in-extent values of the stored chunks
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
    // The chunk's elements in row-major order; those past the dataset's extent (an edge chunk)
    // are not read by libhdf5.
    std::fill(local.begin(), local.end(), 0);
    for (uint64_t e = 0; e < chunk_elements; ++e) {
      bool inside = true;
      for (int r = 0; r < rank; ++r) inside &= offset[r] + local[r] < dims[r];
      if (inside) {
        check_string_value(file, bytes.data() + e * element, in + ": a string value");
        ++stored_values;
      }
      for (int r = rank - 1; r >= 0 && ++local[r] == chunk[r]; --r) local[r] = 0;
    }
  }
  // kvlab writes every string of a dataset, so each lies in a stored chunk. A dataset whose
  // chunks are missing would read as empty strings, and its extent is then bounded by nothing in
  // the file (fuzz_results, libFuzzer out-of-memory: 2.2 GB of string pointers for a dataset of
  // no stored chunks): refused.
  if (stored_values != uint64_t(points))
    fail(in, ": it holds ", points, " strings, of which its chunks store ", stored_values,
         " (kvlab stores every one; corrupt file?)");
}

}  // namespace kvlab::hdf5
