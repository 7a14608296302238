// The limits the results reader (results.cpp) checks a dataset or attribute against before it
// sizes anything from the file or lets libhdf5 read it (internal to kvlab_experiment; the
// byte-level checks before libhdf5 opens the file are hdf5_checks.h).
#pragma once

#include <H5Cpp.h>

#include <cstdint>
#include <string>
#include <vector>

namespace kvlab::results_detail {

// The size of the file holding `obj` (0 when HDF5 cannot tell).
uint64_t file_bytes_of(hid_t obj);

// "PATH: " of the file holding `obj` (errors found below the guarded() layer name the file).
std::string file_prefix(hid_t obj);

// n elements must fit what the file can hold: file bytes x bytes_per_file_byte + slack_bytes.
void check_elements(uint64_t n, uint64_t bytes_per_file_byte, uint64_t slack_bytes, hid_t obj, const std::string& what);

// A chunked dataset spans at most file bytes / 16 + 4096 chunks and stores every one of them.
// Returns whether it is chunked.
bool check_chunks(const H5::DataSet& in, const std::vector<hsize_t>& dims, const std::string& what);

// A variable-length string type must have 1-byte characters.
void check_string_type(hid_t obj, hid_t type, const std::string& what);

}  // namespace kvlab::results_detail
