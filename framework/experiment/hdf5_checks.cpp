// Checks of an HDF5 file's group structure and global heaps before libhdf5 1.10.8 trusts them
// (hdf5_checks.h; the string checks are in hdf5_string_checks.cpp).
#include "framework/experiment/hdf5_checks.h"

#include <cstring>
#include <optional>
#include <unordered_set>
#include <vector>

#include "framework/core/error.h"
#include "framework/experiment/hdf5_object_header.h"
#include "framework/model/mapped_file.h"

namespace kvlab::hdf5 {

namespace fs = std::filesystem;

namespace {

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

// The fill value a fill value message (IV.A.2.f: version 1 or 2 {version, allocation time, write
// time, defined; when defined, u32 size and the value}, version 3 {version, flags; when flags bit
// 5, u32 size and the value}) or an old fill value message (IV.A.2.e: {u32 size, value}) defines
// must fit the message, as libhdf5 1.10.8 decodes it: it reads the dataset's filter pipeline
// first and leaks it when the fill value then fails to decode
// (fuzz_results, LeakSanitizer, 128 bytes under H5Dopen2 -> H5D__layout_oh_read: a defined byte
// of 2 before a size of 256 in an 8-byte message).
void check_fill_value(uint64_t type, const unsigned char* body, uint64_t size, const std::string& in, uint64_t header) {
  uint64_t at = 0;  // where the value's u32 size is
  if (type == 0x04) {
    at = 0;
  } else if (size >= 4 && (body[0] == 1 || body[0] == 2)) {
    if (body[3] == 0) return;
    at = 4;
  } else if (size >= 2 && body[0] == 3) {
    if (!(body[1] & 0x20)) return;
    at = 2;
  } else {
    fail(in, ": the object header at byte ", header, " has a fill value message of version ",
         size ? unsigned(body[0]) : 0u, " in ", size, " bytes, which libhdf5 does not write (corrupt file?)");
  }
  const uint64_t value = size >= at + 4 ? read_le(body + at, 4) : 0;
  if (size < at + 4 || value > size - at - 4)
    fail(in, ": the object header at byte ", header, " has a fill value of ", value, " bytes that does not fit its ",
         size, "-byte message (corrupt file?)");
}

// A datatype (IV.A.2.d: {class in the low 4 bits and version in the high 4, 3 bytes of bit field,
// u32 size, properties}) of a class kvlab writes: fixed-point (0: int8, int64), floating-point
// (1: float32, float64), string (3) and variable-length strings (9 with bit-field type 1). The
// others (time, bitfield, opaque, compound, reference, enum, sequences, array) would only reach
// libhdf5's decoders for them, which is where fuzz_results keeps finding that libhdf5 1.10.8
// trusts sizes and counts; they are refused before it sees them.
void check_datatype_class(const unsigned char* body, uint64_t size, const std::string& in, uint64_t header) {
  if (size < 8) return;  // libhdf5 refuses it
  const unsigned cls = body[0] & 0x0F;
  const bool vlen_string = cls == 9 && (body[1] & 0x0F) == 1;
  if (cls != 0 && cls != 1 && cls != 3 && !vlen_string)
    fail(in, ": the object header at byte ", header, " has a datatype of class ", cls,
         cls == 9 ? " (a sequence)" : "", ", which kvlab does not write (corrupt file?)");
}

// A filter pipeline message (IV.A.2.l) of the filters kvlab writes: deflate (1) and shuffle (2).
// Version 1 {1, n filters, 6 reserved} then per filter {u16 id, u16 name length, u16 flags, u16 n
// values, the name padded to 8, n u32 values padded to 8}; version 2 {2, n filters} then {u16 id,
// u16 name length only when id >= 256, u16 flags, u16 n values, the name unpadded, the values}.
// Other filters (szip, nbit, scale-offset, fletcher32, plugins) would reach libhdf5's decoders for
// their parameters and data, which kvlab has no use for: refused, as is a pipeline that does not
// fit its message.
void check_filter_pipeline(const unsigned char* body, uint64_t size, const std::string& in, uint64_t header) {
  auto refuse = [&](const auto&... why) {
    fail(in, ": the object header at byte ", header, " has a filter pipeline ", why..., " (corrupt file?)");
  };
  if (size < 2 || (body[0] != 1 && body[0] != 2)) refuse("of version ", size ? unsigned(body[0]) : 0u);
  const bool v1 = body[0] == 1;
  uint64_t p = v1 ? 8 : 2;
  for (unsigned f = 0; f < body[1]; ++f) {
    if (p + 2 > size) refuse("that does not fit its ", size, "-byte message");
    const uint64_t id = read_le(body + p, 2);
    if (id != 1 && id != 2) refuse("with filter ", id, ", which kvlab does not write (deflate 1, shuffle 2 only)");
    const bool named = v1 || id >= 256;
    if (p + (named ? 8 : 6) > size) refuse("that does not fit its ", size, "-byte message");
    const uint64_t name = named ? read_le(body + p + 2, 2) : 0;
    const uint64_t values = read_le(body + p + (named ? 6 : 4), 2);
    p += (named ? 8 : 6) + (v1 ? (name + 7) / 8 * 8 : name) + 4 * values + (v1 && values % 2 ? 4 : 0);
    if (p > size) refuse("that does not fit its ", size, "-byte message");
  }
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

}  // namespace

// An attribute message (IV.A.2.m): version 1 {1, reserved, u16 name, datatype and dataspace
// sizes, each part padded to 8}, 2 {2, flags, the three sizes, unpadded} or 3 {as 2, then the
// name's character set}, then the name, datatype, dataspace and data. libhdf5 1.10.8 decodes the
// parts by their sizes without comparing them with the message's (fuzz_results, ASan
// heap-buffer-overflow in H5O__msg_iterate_real under H5Aexists), so they must fit it; and it
// copies the dataspace's elements times the datatype's size of data out of the message without
// comparing that with what the message holds (the same report, 2026-12-07: an 8-byte integer
// attribute whose datatype said 48 bytes), so the data must fit too.
void check_attribute_fits(const unsigned char* body, uint64_t size, size_t len_size, uint64_t file_bytes,
                          const std::string& in, uint64_t header) {
  if (size < 8 || body[0] < 1 || body[0] > 3) return;  // libhdf5 refuses these itself
  const uint64_t name = read_le(body + 2, 2), type = read_le(body + 4, 2), space = read_le(body + 6, 2);
  auto pad = [&](uint64_t v) { return body[0] == 1 ? (v + 7) / 8 * 8 : v; };
  const uint64_t prefix = body[0] == 3 ? 9 : 8;
  const uint64_t parts = prefix + pad(name) + pad(type) + pad(space);
  if (parts > size)
    fail(in, ": the object header at byte ", header, " has an attribute message whose name, datatype and dataspace (",
         parts, " bytes with its header) do not fit its ", size, " bytes (corrupt file?)");
  // The name is copied with strdup: it must end inside its `name` bytes (the size counts the
  // terminating NUL; fuzz_results, ASan heap-buffer-overflow in strdup under H5Aexists).
  const unsigned char* text = body + prefix;
  if (std::memchr(text, 0, name) == nullptr)
    fail(in, ": the object header at byte ", header, " has an attribute message whose name does not end within its ",
         name, " bytes (corrupt file?)");
  // The data: elements x element size, each part as libhdf5 reads it (datatype {class and
  // version, 3 bytes of bit field, u32 size, ...}); what libhdf5 refuses itself is left to it.
  const unsigned char* datatype = text + pad(name);
  check_datatype_class(datatype, type, in, header);
  const std::optional<uint64_t> elements = dataspace_elements(datatype + pad(type), space, len_size, file_bytes);
  if (type < 8 || !elements) return;
  const uint64_t element_bytes = read_le(datatype + 4, 4), data = size - parts;
  if (element_bytes != 0 && *elements > data / element_bytes)
    fail(in, ": the object header at byte ", header, " has an attribute message whose data (", *elements,
         " elements of ", element_bytes, " bytes) does not fit its ", data, " bytes (corrupt file?)");
}


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
        if (type == 0x04 || type == 0x05) check_fill_value(type, body, size, in, at);
        if (type == 0x01 && size >= 2) {
          rank = body[1];  // dataspace {version, rank, ...}
          elements = dataspace_elements(body, size, len, n);
        }
        if (type == 0x03) check_datatype_class(body, size, in, at);
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
          check_filter_pipeline(body, size, in, at);
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

}  // namespace kvlab::hdf5
