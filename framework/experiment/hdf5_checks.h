// Checks of an HDF5 file's own bytes for what libhdf5 1.10.8 (Debian 12's) trusts unchecked, run
// before libhdf5 reads those structures (each found by fuzz_results: fuzz/README.md). Each throws
// one kvlab::Error naming the file and the structure; a file kvlab wrote always passes. They read
// the structures kvlab's files use (version 0/1 superblock, version-1 object headers,
// symbol-table groups); anything else is left to libhdf5, which checks it itself.
#pragma once

#include <H5Cpp.h>

#include <filesystem>
#include <string>

namespace kvlab::hdf5 {

// Refuses an object header chunk or a local heap that runs past the end of the file: libhdf5
// allocates the size a file claims for them before comparing it with the file's end (an ~8 EiB
// malloc in H5C_protect at H5Fopen). Walks the group structure from the superblock's root entry:
// every group's and member's object header (its continuations included), group B-trees, symbol
// table nodes and local heaps. Call before opening the file with libhdf5.
void check_object_headers(const std::filesystem::path& path);

// Refuses (kvlab::Error naming the file) a global heap collection whose objects overrun it:
// libhdf5 1.10 trusts those sizes.
void check_global_heaps(const std::filesystem::path& path);

// Refuses (kvlab::Error naming the file and `what`) variable-length strings in the attribute
// messages of the object holding attribute `attr` that libhdf5 1.10.8 would read unchecked: each
// value names a global heap object {length, collection, index}, and 1.10.8 neither checks the
// index against the collection (an index past it: SEGV in H5HG_read) nor the length against the
// object (a claimed 4 GiB is allocated; a longer object is copied past the buffer). Call before
// reading a string attribute. Reads the file's own bytes: version-1 object headers only (what
// libhdf5 writes by default, and kvlab), others are refused.
void check_string_attributes(hid_t attr, const std::string& what);

// The same for the variable-length strings of dataset `dset`, read from its chunks' stored bytes
// through the filters kvlab writes (shuffle, deflate); a string dataset stored otherwise (not
// chunked, other filters) is refused, as kvlab writes none. Call before reading its strings.
void check_string_dataset(hid_t dset, const std::string& what);

// Every stored chunk of the chunked numeric dataset `dset` (elements of element_bytes) comes out
// of its filters (shuffle, deflate) as exactly its chunk's bytes: libhdf5 1.10.8 copies a whole
// chunk out of whatever the filters returned. One error naming the file, `what` and the chunk.
void check_chunk_sizes(hid_t dset, uint64_t element_bytes, const std::string& what);

}  // namespace kvlab::hdf5
