// The version-1 object header walk shared by the checks of hdf5_checks.cpp and
// hdf5_string_checks.cpp (internal to kvlab_experiment_base; the checks are in hdf5_checks.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "framework/core/error.h"

namespace kvlab::hdf5 {

// The little-endian unsigned integer of `bytes` bytes (1..8) at p.
inline uint64_t read_le(const unsigned char* p, size_t bytes) {
  uint64_t v = 0;
  for (size_t k = 0; k < bytes; ++k) v |= uint64_t(p[k]) << (8 * k);
  return v;
}

// An attribute message's name, datatype, dataspace and data must fit it (hdf5_checks.cpp says why);
// len_size: the file's size of lengths, file_bytes its size.
void check_attribute_fits(const unsigned char* body, uint64_t size, size_t len_size, uint64_t file_bytes,
                          const std::string& in, uint64_t header);

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
    // Version-1 messages tile their chunk (libhdf5 writes null messages into free space). One
    // running past the chunk's end, or a tail too short for a message header, makes libhdf5
    // 1.10.8 refuse the header and leak the H5O_t it was building (LeakSanitizer, 424 bytes
    // from H5FL_reg_calloc under H5Fopen -> H5G_mkroot -> H5O_protect, fuzz_results with
    // -seed=1: one inserted byte shifted the root header's size and messages).
    uint64_t p = start;
    for (; length - (p - start) >= 8;) {
      const uint64_t type = read_le(d + p, 2), size = read_le(d + p + 2, 2);
      const uint64_t body = p + 8;
      if (size > start + length - body)
        fail(in, ": the object header at byte ", addr, " has a message of ", size, " bytes at byte ", p,
             " running past the end of its ", length, "-byte chunk at byte ", start, " (corrupt file?)");
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
      if (type == 0x0C) check_attribute_fits(d + body, size, len_size, n, in, addr);
      on_message(type, d + body, size, d[p + 4]);
      p = body + size;
    }
    if (p != start + length)
      fail(in, ": the object header at byte ", addr, " ends its ", length, "-byte chunk at byte ", start, " with ",
           start + length - p, " bytes that hold no message (corrupt file?)");
  }
}

}  // namespace kvlab::hdf5
