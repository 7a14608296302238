// One table of (value, name) pairs per enum, read both ways: the name of a value (for files,
// logs and HDF5 attributes) and the value of a name (for YAML and the command line), so that an
// enum's spellings are written once.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvlab {

template <class E>
struct EnumName {
  E value;
  const char* name;
};

// The name of `value`; "?" for a value the table does not hold.
template <class E, size_t N>
constexpr const char* enum_name(const EnumName<E> (&table)[N], E value) {
  for (const EnumName<E>& e : table)
    if (e.value == value) return e.name;
  return "?";
}

// The value named `name`; nullopt for a name the table does not hold.
template <class E, size_t N>
constexpr std::optional<E> enum_from_name(const EnumName<E> (&table)[N], std::string_view name) {
  for (const EnumName<E>& e : table)
    if (name == e.name) return e.value;
  return std::nullopt;
}

// Every name in table order (the choices an error message lists).
template <class E, size_t N>
std::vector<std::string> enum_names(const EnumName<E> (&table)[N]) {
  std::vector<std::string> names;
  for (const EnumName<E>& e : table) names.emplace_back(e.name);
  return names;
}

}  // namespace kvlab
