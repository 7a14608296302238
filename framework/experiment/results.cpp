#include "framework/experiment/results.h"

#include <H5Cpp.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <ctime>
#include <new>
#include <optional>
#include <thread>

#include "framework/core/error.h"
#include "framework/experiment/hdf5_checks.h"
#include "framework/experiment/hdf5_file.h"
#include "framework/experiment/results_read_checks.h"
#include "framework/model/mapped_file.h"

namespace kvlab {
namespace {

namespace fs = std::filesystem;
using hdf5::check_global_heaps;
using hdf5::check_object_headers;
using hdf5::guarded;
using hdf5::hdf5_system_errors;
using hdf5::open_file;
using hdf5::rebuild_file;
using hdf5::replace_file;
using results_detail::check_chunks;
using results_detail::check_elements;
using results_detail::check_string_type;
using results_detail::file_bytes_of;
using results_detail::file_prefix;

constexpr int kDeflateLevel = 4;
constexpr uint64_t kChunkElements = 1 << 16;  // ~256 KiB of float32 per chunk

H5::StrType vlen_string_type() {
  H5::StrType t(H5::PredType::C_S1, H5T_VARIABLE);
  t.setCset(H5T_CSET_UTF8);
  return t;
}

void write_attr(H5::H5Object& obj, const std::string& name, const AttrValue& value) {
  if (obj.attrExists(name)) obj.removeAttr(name);
  if (auto* i = std::get_if<int64_t>(&value)) {
    H5::Attribute a = obj.createAttribute(name, H5::PredType::NATIVE_INT64, H5::DataSpace(H5S_SCALAR));
    a.write(H5::PredType::NATIVE_INT64, i);
  } else if (auto* d = std::get_if<double>(&value)) {
    H5::Attribute a = obj.createAttribute(name, H5::PredType::NATIVE_DOUBLE, H5::DataSpace(H5S_SCALAR));
    a.write(H5::PredType::NATIVE_DOUBLE, d);
  } else if (auto* s = std::get_if<std::string>(&value)) {
    H5::StrType t = vlen_string_type();
    H5::Attribute a = obj.createAttribute(name, t, H5::DataSpace(H5S_SCALAR));
    const char* p = s->c_str();
    a.write(t, &p);
  } else if (auto* vi = std::get_if<std::vector<int64_t>>(&value)) {
    hsize_t n = vi->size();
    H5::Attribute a = obj.createAttribute(name, H5::PredType::NATIVE_INT64, H5::DataSpace(1, &n));
    if (n) a.write(H5::PredType::NATIVE_INT64, vi->data());
  } else {
    const auto& vd = std::get<std::vector<double>>(value);
    hsize_t n = vd.size();
    H5::Attribute a = obj.createAttribute(name, H5::PredType::NATIVE_DOUBLE, H5::DataSpace(1, &n));
    if (n) a.write(H5::PredType::NATIVE_DOUBLE, vd.data());
  }
}

AttrValue read_attr(const H5::Attribute& a) {
  const H5::DataSpace space = a.getSpace();
  const bool scalar = space.getSimpleExtentType() == H5S_SCALAR;
  const hssize_t n = space.getSimpleExtentNpoints();
  const std::string what = "attribute '" + a.getName() + "'";
  check_elements(uint64_t(n), 1, 0, a.getId(), what);
  if (scalar && n != 1) fail(file_prefix(a.getId()), what, " is a scalar without a value");
  const H5T_class_t cls = a.getTypeClass();
  if (cls == H5T_STRING) {
    // kvlab writes string attributes as one value. H5::Attribute::read(type, std::string) reads
    // into one char*, so a variable-length string array would be written past it.
    if (n != 1) fail(file_prefix(a.getId()), what, " holds ", n, " strings, not one (corrupt file?)");
    H5::StrType t = a.getStrType();
    check_string_type(a.getId(), t.getId(), what);
    std::string s;
    if (t.isVariableStr()) {
      hdf5::check_string_attributes(a.getId(), what);
      // Read through the C API: a null string (no heap object) reads as a null pointer, which
      // H5::Attribute::read(type, std::string) passes to strlen (fuzz_results, ASan SEGV in
      // H5::Attribute::p_read_variable_len). kvlab writes none; it reads as "".
      char* value = nullptr;
      if (H5Aread(a.getId(), t.getId(), &value) < 0) fail(file_prefix(a.getId()), what, " cannot be read (corrupt file?)");
      const std::unique_ptr<char, herr_t (*)(void*)> owned(value, H5free_memory);
      if (value) s = value;
    } else {
      a.read(t, s);
    }
    return s;
  }
  if (cls == H5T_INTEGER) {
    std::vector<int64_t> v(n);
    if (n) a.read(H5::PredType::NATIVE_INT64, v.data());
    if (scalar) return v.at(0);
    return v;
  }
  if (cls == H5T_FLOAT) {
    std::vector<double> v(n);
    if (n) a.read(H5::PredType::NATIVE_DOUBLE, v.data());
    if (scalar) return v.at(0);
    return v;
  }
  fail(file_prefix(a.getId()), what, " has an unsupported type");
}

AttrMap read_attrs(const H5::H5Object& obj) {
  AttrMap out;
  const int n = obj.getNumAttrs();
  for (int i = 0; i < n; ++i) {
    H5::Attribute a = obj.openAttribute(static_cast<unsigned>(i));
    out[a.getName()] = read_attr(a);
  }
  return out;
}

std::vector<std::string> child_names(const H5::Group& g) {
  std::vector<std::string> out;
  const hsize_t n = g.getNumObjs();
  for (hsize_t i = 0; i < n; ++i) out.push_back(g.getObjnameByIdx(i));
  std::sort(out.begin(), out.end());
  return out;
}

// Calls fn(run, cells, name) for each cell `name` of the group `cells` of every run that has one.
template <class Fn>
void for_each_cell(H5::H5File& f, Fn&& fn) {
  H5::Group runs = f.openGroup("runs");
  for (const auto& run : child_names(runs)) {
    H5::Group r = runs.openGroup(run);
    if (!r.nameExists("cells")) continue;
    H5::Group cells = r.openGroup("cells");
    for (const auto& name : child_names(cells)) fn(run, cells, name);
  }
}

H5::Group ensure_group(H5::Group& parent, const std::string& name) {
  if (parent.nameExists(name)) return parent.openGroup(name);
  return parent.createGroup(name);
}

void write_dataset(H5::Group& g, const std::string& name, const Dataset& ds) {
  const std::vector<uint64_t> dims64 = ds.dims();
  std::vector<hsize_t> dims(dims64.begin(), dims64.end());
  uint64_t total = 1;
  for (uint64_t d : dims64) total *= d;
  KVLAB_CHECK(total == ds.size(), "dataset '", name, "': shape does not match its data");
  H5::DataSpace space(int(dims.size()), dims.data());
  H5::DSetCreatPropList props;
  if (total > 0) {
    // Chunk: the trailing dimensions whole as far as kChunkElements allows, leading ones 1.
    std::vector<hsize_t> chunk(dims.size(), 1);
    uint64_t elems = 1;
    for (size_t i = dims.size(); i-- > 0;) {
      chunk[i] = std::max<hsize_t>(1, std::min<hsize_t>(dims[i], kChunkElements / elems));
      elems *= chunk[i];
    }
    props.setChunk(int(chunk.size()), chunk.data());
    props.setShuffle();
    props.setDeflate(kDeflateLevel);
  }
  H5::DataSet out;
  std::visit(
      [&](const auto& v) {
        using T = typename std::decay_t<decltype(v)>::value_type;
        if constexpr (std::is_same_v<T, std::string>) {
          H5::StrType t = vlen_string_type();
          out = g.createDataSet(name, t, space, props);
          std::vector<const char*> ptrs;
          for (const auto& s : v) ptrs.push_back(s.c_str());
          if (total) out.write(ptrs.data(), t);
        } else {
          const H5::PredType& t = std::is_same_v<T, float>     ? H5::PredType::NATIVE_FLOAT
                                  : std::is_same_v<T, double>  ? H5::PredType::NATIVE_DOUBLE
                                  : std::is_same_v<T, int64_t> ? H5::PredType::NATIVE_INT64
                                                               : H5::PredType::NATIVE_INT8;
          out = g.createDataSet(name, t, space, props);
          if (total) out.write(v.data(), t);
        }
      },
      ds.data);
  for (const auto& [k, a] : ds.attrs) write_attr(out, k, a);
}

// n elements of `in` as T (n already checked against the file's size).
template <class T>
std::vector<T> read_values(const H5::DataSet& in, size_t n, const H5::PredType& type) {
  std::vector<T> v(n);
  if (n) in.read(v.data(), type);
  return v;
}

Dataset read_dataset(const H5::DataSet& in) {
  Dataset ds;
  const H5::DataSpace space = in.getSpace();
  const int rank = space.getSimpleExtentNdims();
  std::vector<hsize_t> dims(rank);
  space.getSimpleExtentDims(dims.data());
  ds.shape.assign(dims.begin(), dims.end());
  const size_t n = size_t(space.getSimpleExtentNpoints());
  const std::string what = "dataset '" + in.getObjName() + "'";
  check_elements(n, 1100, 1 << 20, in.getId(), what);
  const H5T_class_t cls = in.getTypeClass();
  if (cls == H5T_STRING) {  // (its own check names the strings its chunks lack)
    check_string_type(in.getId(), in.getStrType().getId(), what);
    hdf5::check_string_dataset(in.getId(), what);
  }
  const bool chunked = check_chunks(in, dims, what);
  if (chunked && n > 0 && (cls == H5T_FLOAT || cls == H5T_INTEGER))
    hdf5::check_chunk_sizes(in.getId(), in.getDataType().getSize(), what);
  if (cls == H5T_STRING) {
    H5::StrType t = vlen_string_type();
    std::vector<char*> ptrs(n, nullptr);
    // The strings HDF5 allocated are freed however this ends: a read failing part-way has
    // converted some elements already, and copying them may throw bad_alloc. Reclaiming skips
    // the null pointers (H5Dvlen_reclaim).
    struct Reclaim {
      std::vector<char*>& p;
      const H5::StrType& t;
      const H5::DataSpace& s;
      ~Reclaim() {
        if (!p.empty()) H5Dvlen_reclaim(t.getId(), s.getId(), H5P_DEFAULT, p.data());
      }
    } reclaim{ptrs, t, space};
    if (n) in.read(ptrs.data(), t);
    std::vector<std::string> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = ptrs[i] ? ptrs[i] : "";
    ds.data = std::move(v);
  } else if (cls == H5T_FLOAT) {
    if (in.getFloatType().getSize() == 4) {
      ds.data = read_values<float>(in, n, H5::PredType::NATIVE_FLOAT);
    } else {
      ds.data = read_values<double>(in, n, H5::PredType::NATIVE_DOUBLE);
    }
  } else if (cls == H5T_INTEGER) {
    if (in.getIntType().getSize() == 1) {
      ds.data = read_values<int8_t>(in, n, H5::PredType::NATIVE_INT8);
    } else {
      ds.data = read_values<int64_t>(in, n, H5::PredType::NATIVE_INT64);
    }
  } else {
    fail(file_prefix(in.getId()), "dataset '", in.getObjName(), "' has an unsupported type");
  }
  ds.attrs = read_attrs(in);
  return ds;
}

// Copies the group `from` (attributes, groups, datasets, recursively) into the group `to`
// through kvlab's own checked reader and writer, leaving out the members `keep(path)` refuses
// (`path` from the root, e.g. "runs/full/cells/b"). H5Ocopy would be shorter but trusts the
// source's bytes (fuzz_results: ASan SEGV in H5T_close_real under H5O_copy_header_map).
// kvlab's groups nest 3 deep (runs/RUN/cells/CELL); a file nesting deeper (a group linked
// into itself, say) is refused.
constexpr int kMaxGroupDepth = 8;
void copy_group(const H5::Group& from, H5::Group& to, const std::string& path,
                const std::function<bool(const std::string& path)>& keep, int depth = 0) {
  if (depth > kMaxGroupDepth)
    fail(file_prefix(from.getId()), "groups nest deeper than ", kMaxGroupDepth, " at '", path,
         "' (not a kvlab results file)");
  for (const auto& [name, value] : read_attrs(from)) write_attr(to, name, value);
  for (const std::string& name : child_names(from)) {
    const std::string member = path.empty() ? name : path + "/" + name;
    if (!keep(member)) continue;
    const H5O_type_t type = from.childObjType(name);
    if (type == H5O_TYPE_GROUP) {
      H5::Group copy = to.createGroup(name);
      copy_group(from.openGroup(name), copy, member, keep, depth + 1);
    } else if (type == H5O_TYPE_DATASET) {
      write_dataset(to, name, read_dataset(from.openDataSet(name)));
    } else {
      fail(file_prefix(from.getId()), "'", member, "' is neither a group nor a dataset (not a kvlab results file)");
    }
  }
}

bool group_complete(const H5::Group& g) {
  if (!g.attrExists("complete")) return false;
  const AttrValue v = read_attr(g.openAttribute("complete"));
  const auto* i = std::get_if<int64_t>(&v);
  return i && *i == 1;
}

// The group of cell RUN/CELL, read-only; an Error naming the file when there is none.
H5::Group open_cell(const fs::path& path, const std::string& run, const std::string& cell) {
  H5::H5File f = open_file(path, H5F_ACC_RDONLY);
  const std::string p = "runs/" + run + "/cells/" + cell;
  if (!f.nameExists("runs/" + run) || !f.nameExists("runs/" + run + "/cells") || !f.nameExists(p))
    fail(path.string(), ": no cell ", run, "/", cell);
  return f.openGroup(p);
}

}  // namespace

size_t Dataset::size() const {
  return std::visit([](const auto& v) { return v.size(); }, data);
}

std::vector<uint64_t> Dataset::dims() const {
  if (shape.empty()) return {uint64_t(size())};
  return shape;
}

bool is_timing_attr(const std::string& name) {
  static const char* kTiming[] = {"start_time", "end_time", "host", "prefill_s", "decode_s",
                                  "tokens_per_s", "prefill_tokens_per_s", "decode_tokens_per_s",
                                  "wall_s", "git_commit", "kvlab_version", "finished_at", "sample_s",
                                  "sample_cpu_s",
                                  // how a cell was computed, not what (engine.prefix_reuse)
                                  "prefill_tokens_saved"};
  for (const char* t : kTiming)
    if (name == t) return true;
  return false;
}

ResultsFile ResultsFile::create(const fs::path& path, const AttrMap& root_attrs) {
  if (path.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    if (ec) fail(path.string(), ": cannot create its directory: ", ec.message());
  }
  replace_file(path, "creating the results file", /*create=*/true, [&](H5::H5File& f) {
    for (const auto& [k, v] : root_attrs) write_attr(f, k, v);
    write_attr(f, "schema_version", int64_t(kResultsSchemaVersion));
    f.createGroup("runs");
  });
  return ResultsFile(path);
}


ResultsFile ResultsFile::open(const fs::path& path) {
  if (!fs::exists(path)) fail(path.string(), ": results file not found");
  return guarded(path, "opening the results file", [&] {
    if (!H5::H5File::isHdf5(path.string())) fail(path.string(), ": not an HDF5 file");
    check_object_headers(path);
    check_global_heaps(path);
    H5::H5File f;
    try {
      f = open_file(path, H5F_ACC_RDONLY);
    } catch (const H5::Exception& e) {
      const std::string sys = hdf5_system_errors();
      fail(path.string(), ": cannot open it as an HDF5 file (", sys.empty() ? "truncated or damaged?" : sys, "): ",
           e.getDetailMsg());
    }
    if (!f.attrExists("schema_version") || !f.nameExists("runs"))
      fail(path.string(), ": not a kvlab results file (no schema_version attribute or /runs group)");
    const AttrValue v = read_attr(f.openAttribute("schema_version"));
    const auto* version = std::get_if<int64_t>(&v);
    if (!version || *version > kResultsSchemaVersion)
      fail(path.string(), ": results schema version ", version ? *version : -1,
           " is newer than this kvlab understands (", kResultsSchemaVersion, ")");
    return ResultsFile(path);
  });
}

AttrMap ResultsFile::root_attrs() const {
  return guarded(path_, "reading root attributes", [&] {
    H5::H5File f = open_file(path_, H5F_ACC_RDONLY);
    return read_attrs(f);
  });
}

void ResultsFile::set_root_attr(const std::string& name, const AttrValue& value) {
  replace_file(path_, "writing root attribute " + name, false, [&](H5::H5File& f) { write_attr(f, name, value); });
}

void ResultsFile::ensure_run(const std::string& run, const AttrMap& attrs) {
  // The run's attributes are (re)written every time: a resumed experiment records its current
  // settings (effective parameters) on an existing run group too.
  replace_file(path_, "creating run group " + run, false, [&](H5::H5File& f) {
    H5::Group runs = f.openGroup("runs");
    H5::Group g = ensure_group(runs, run);
    for (const auto& [k, v] : attrs) write_attr(g, k, v);
    ensure_group(g, "cells");
  });
}

std::vector<std::string> ResultsFile::runs() const {
  return guarded(path_, "listing runs", [&] {
    H5::H5File f = open_file(path_, H5F_ACC_RDONLY);
    return child_names(f.openGroup("runs"));
  });
}

AttrMap ResultsFile::run_attrs(const std::string& run) const {
  return guarded(path_, "reading run " + run, [&] {
    H5::H5File f = open_file(path_, H5F_ACC_RDONLY);
    return read_attrs(f.openGroup("runs/" + run));
  });
}

std::vector<std::string> ResultsFile::complete_cells(const std::string& run) const {
  return guarded(path_, "listing cells of run " + run, [&] {
    H5::H5File f = open_file(path_, H5F_ACC_RDONLY);
    std::vector<std::string> out;
    const std::string cells_path = "runs/" + run + "/cells";
    if (!f.nameExists("runs/" + run) || !f.nameExists(cells_path)) return out;
    H5::Group cells = f.openGroup(cells_path);
    for (const auto& name : child_names(cells))
      if (group_complete(cells.openGroup(name))) out.push_back(name);
    return out;
  });
}

bool ResultsFile::cell_complete(const std::string& run, const std::string& cell) const {
  return guarded(path_, "reading cell " + run + "/" + cell, [&] {
    H5::H5File f = open_file(path_, H5F_ACC_RDONLY);
    const std::string p = "runs/" + run + "/cells/" + cell;
    return f.nameExists("runs/" + run) && f.nameExists("runs/" + run + "/cells") &&
           f.nameExists(p) && group_complete(f.openGroup(p));
  });
}

int ResultsFile::delete_incomplete_cells() {
  // Files written by this build never hold an incomplete cell (every change replaces the file
  // whole); older builds' files may. Look first, so a clean file is not rewritten.
  const bool any = guarded(path_, "looking for interrupted cells", [&] {
    H5::H5File f = open_file(path_, H5F_ACC_RDONLY);
    bool incomplete = false;
    for_each_cell(f, [&](const std::string&, H5::Group& cells, const std::string& name) {
      incomplete = incomplete || !group_complete(cells.openGroup(name));
    });
    return incomplete;
  });
  if (!any) return 0;
  // A new file holding everything but those cells (rebuild_file, copy_group): what an
  // interrupted write left is never read.
  int deleted = 0;
  rebuild_file(path_, "deleting interrupted cells", [&](const H5::H5File& source, H5::H5File& f) {
    const H5::Group from = source.openGroup("/");
    H5::Group to = f.openGroup("/");
    copy_group(from, to, "", [&](const std::string& path) {
      std::vector<std::string> parts;  // a cell is runs/RUN/cells/CELL
      for (size_t b = 0, e; b <= path.size(); b = e + 1) {
        e = std::min(path.find('/', b), path.size());
        parts.push_back(path.substr(b, e - b));
      }
      const bool cell = parts.size() == 4 && parts[0] == "runs" && parts[2] == "cells";
      if (!cell || group_complete(source.openGroup(path))) return true;
      ++deleted;
      return false;
    });
  });
  return deleted;
}

void ResultsFile::write_cell(const std::string& run, const std::string& cell, const CellRecord& record) {
  replace_file(path_, "writing cell " + run + "/" + cell, false, [&](H5::H5File& f) {
    H5::Group runs = f.openGroup("runs");
    H5::Group r = ensure_group(runs, run);
    H5::Group cells = ensure_group(r, "cells");
    if (cells.nameExists(cell)) {
      if (group_complete(cells.openGroup(cell)))
        fail(path_.string(), ": cell ", run, "/", cell, " is already complete");
      cells.unlink(cell);
    }
    H5::Group g = cells.createGroup(cell);
    for (const auto& [name, ds] : record.datasets) write_dataset(g, name, ds);
    for (const auto& [k, v] : record.attrs)
      if (k != "complete") write_attr(g, k, v);
    // The file is replaced whole (replace_file), so a cell is never seen half written; the
    // mark stays for readers of files from older builds, which wrote in place.
    write_attr(g, "complete", int64_t(1));
  });
}

CellRecord ResultsFile::read_cell(const std::string& run, const std::string& cell) const {
  return guarded(path_, "reading cell " + run + "/" + cell, [&] {
    const H5::Group g = open_cell(path_, run, cell);
    CellRecord rec;
    rec.attrs = read_attrs(g);
    for (const auto& name : child_names(g)) rec.datasets[name] = read_dataset(g.openDataSet(name));
    return rec;
  });
}

AttrMap ResultsFile::cell_attrs(const std::string& run, const std::string& cell) const {
  return guarded(path_, "reading cell " + run + "/" + cell, [&] {
    return read_attrs(open_cell(path_, run, cell));
  });
}

std::map<std::string, std::map<std::string, AttrMap>> ResultsFile::all_cell_attrs() const {
  return guarded(path_, "reading the cells", [&] {
    H5::H5File f = open_file(path_, H5F_ACC_RDONLY);
    std::map<std::string, std::map<std::string, AttrMap>> out;
    H5::Group runs = f.openGroup("runs");
    for (const auto& run : child_names(runs)) {
      H5::Group r = runs.openGroup(run);
      out[run];
      if (!r.nameExists("cells")) continue;
      H5::Group cells = r.openGroup("cells");
      for (const auto& name : child_names(cells)) {
        H5::Group g = cells.openGroup(name);
        if (group_complete(g)) out[run][name] = read_attrs(g);
      }
    }
    return out;
  });
}

std::map<std::string, std::map<std::string, CellRecord>> ResultsFile::peer_cells() const {
  return guarded(path_, "reading /peer", [&] {
    H5::H5File f = open_file(path_, H5F_ACC_RDONLY);
    std::map<std::string, std::map<std::string, CellRecord>> out;
    if (!f.nameExists("peer")) return out;
    H5::Group peer = f.openGroup("peer");
    for (const auto& run : child_names(peer)) {
      H5::Group r = peer.openGroup(run);
      for (const auto& name : child_names(r)) {
        H5::Group g = r.openGroup(name);
        if (!group_complete(g)) continue;
        CellRecord& rec = out[run][name];
        rec.attrs = read_attrs(g);
        for (const auto& d : child_names(g)) rec.datasets[d] = read_dataset(g.openDataSet(d));
      }
    }
    return out;
  });
}

void ResultsFile::write_summary(const std::string& run, const std::string& group,
                                const std::map<std::string, Dataset>& datasets, const AttrMap& attrs) {
  replace_file(path_, "writing summary " + run + "/" + group, false, [&](H5::H5File& f) {
    H5::Group runs = f.openGroup("runs");
    H5::Group r = ensure_group(runs, run);
    if (r.nameExists(group)) r.unlink(group);
    H5::Group g = r.createGroup(group);
    for (const auto& [name, ds] : datasets) write_dataset(g, name, ds);
    for (const auto& [k, v] : attrs) write_attr(g, k, v);
  });
}

std::map<std::string, Dataset> ResultsFile::read_summary(const std::string& run, const std::string& group,
                                                         AttrMap* attrs) const {
  return guarded(path_, "reading summary " + run + "/" + group, [&] {
    H5::H5File f = open_file(path_, H5F_ACC_RDONLY);
    const std::string p = "runs/" + run + "/" + group;
    std::map<std::string, Dataset> out;
    if (!f.nameExists("runs/" + run) || !f.nameExists(p)) return out;
    H5::Group g = f.openGroup(p);
    if (attrs) *attrs = read_attrs(g);
    for (const auto& name : child_names(g)) out[name] = read_dataset(g.openDataSet(name));
    return out;
  });
}

std::string utc_now_iso8601() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

}  // namespace kvlab
