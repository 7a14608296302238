// Checks of an HDF5 file's own bytes before libhdf5 1.10.8 trusts them (hdf5_checks.h).
#include "framework/experiment/hdf5_checks.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <unordered_set>
#include <utility>
#include <vector>

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
      on_message(type, d + body, size, d[p + 4]);
      p = body + size;
    }
  }
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
      walk_object_header(d, n, at, off, len, in, [&](uint64_t type, const unsigned char* body, uint64_t size, unsigned) {
        if (type == 0x11 && size >= 2 * off) {  // symbol table message: the object is a group
          trees.push_back({read_le(body, off), 0, len});
          check_heap(read_le(body + off, off));
        } else if (type == 0x08 && size >= 3 + off && body[0] == 3 && body[1] == 2) {  // chunked layout
          trees.push_back({read_le(body + 3, off), 1, 8 + 8 * uint64_t(body[2])});
        }
      });
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
          trees.push_back({address, t.type, t.key});
        } else if (t.type == 0) {
          nodes.push_back(address);
        } else if (const uint64_t bytes = read_le(d + key, 4); !fits(address, bytes)) {
          fail(in, ": a dataset chunk at byte ", address, " claims ", bytes, " bytes, past the end of the ", n,
               "-byte file (corrupt file?)");
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
  std::string path;
  if (const ssize_t len = H5Fget_name(attr, nullptr, 0); len > 0) {
    path.resize(size_t(len) + 1);
    if (H5Fget_name(attr, path.data(), path.size()) < 0) path.clear();
    path.resize(std::min(path.size(), size_t(len)));
  }
  const std::string in = path + ": " + what;
  H5O_info_t info;
  if (H5Oget_info2(attr, &info, H5O_INFO_BASIC) < 0) fail(in, ": cannot locate its object header (corrupt file?)");
  // The file's bytes: mapped when HDF5 reads it from disk, else (an in-memory image) copied.
  std::optional<MappedFile> map;
  std::vector<unsigned char> image;
  {
    const hid_t file = H5Iget_file_id(attr);
    const hid_t fapl = file < 0 ? -1 : H5Fget_access_plist(file);
    const bool on_disk = fapl >= 0 && H5Pget_driver(fapl) == H5FD_SEC2;
    if (!on_disk && file >= 0) {
      const ssize_t size = H5Fget_file_image(file, nullptr, 0);
      if (size > 0) {
        image.resize(size_t(size));
        if (H5Fget_file_image(file, image.data(), image.size()) != size) image.clear();
      }
    }
    if (fapl >= 0) H5Pclose(fapl);
    if (file >= 0) H5Fclose(file);
    if (on_disk) {
      map = MappedFile::open(path);
    } else if (image.empty()) {
      fail(in, ": cannot read the file's bytes to check it");
    }
  }
  const auto* d = map ? reinterpret_cast<const unsigned char*>(map->data()) : image.data();
  const size_t n = map ? map->size() : image.size();
  // Superblock at byte 0 (kvlab writes no user block), base address 0; sizes of offsets/lengths.
  if (n < 40 || std::memcmp(d, "\x89HDF\r\n\x1a\n", 8) != 0)
    fail(in, ": the file does not start with an HDF5 superblock, which kvlab writes at byte 0");
  const unsigned sb = d[8];
  const size_t off_size = sb <= 1 ? d[13] : d[9];
  const size_t len_size = sb <= 1 ? d[14] : d[10];
  const size_t base_at = sb == 0 ? 24 : sb == 1 ? 28 : 12;
  if ((off_size != 2 && off_size != 4 && off_size != 8) || (len_size != 2 && len_size != 4 && len_size != 8) ||
      base_at + off_size > n || read_le(d + base_at, off_size) != 0)
    fail(in, ": superblock sizes or base address kvlab does not write (corrupt file?)");
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
      for (uint64_t e = 0; e < count; ++e) {
        const unsigned char* v = b + data + e * element;
        const uint64_t chars = read_le(v, 4), heap = read_le(v + 4, off_size), index = read_le(v + 4 + off_size, 4);
        if (heap == 0) continue;  // a null string: libhdf5 reads nothing
        const std::string value = in + ": a string value of the object";
        const std::optional<uint64_t> bytes = heap_object_size(d, n, heap, len_size, index, value);
        if (!bytes)
          fail(value, " names object ", index, " of the global heap collection at byte ", heap,
               ", which it does not hold (corrupt file?)");
        if (*bytes != chars)
          fail(value, " claims ", chars, " bytes; its global heap object holds ", *bytes, " (corrupt file?)");
      }
    }
  });
}

}  // namespace kvlab::hdf5
