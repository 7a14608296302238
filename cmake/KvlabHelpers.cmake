# Small helpers so each folder's CMakeLists.txt stays a few lines long.

# kvlab_add_library(NAME SOURCES a.cpp b.cpp DEPS kvlab_core ... [PRIVATE_DEPS ...])
# A static library whose headers are included as "framework/...", "kernels/...", "policies/...".
function(kvlab_add_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  if(ARG_SOURCES)
    add_library(${name} STATIC ${ARG_SOURCES})
    target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}/generated)
    target_link_libraries(${name} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  else()
    add_library(${name} INTERFACE)
    target_include_directories(${name} INTERFACE ${PROJECT_SOURCE_DIR} ${PROJECT_BINARY_DIR}/generated)
    target_link_libraries(${name} INTERFACE ${ARG_DEPS})
  endif()
endfunction()

# kvlab_add_test(NAME SOURCES x_test.cpp DEPS lib ... [LABELS l] [FIXTURES f])
# A GoogleTest executable registered with CTest. Tests find the source and build trees through
# the compile definitions KVLAB_SOURCE_DIR / KVLAB_BINARY_DIR, and ../shared through the
# environment variable KVLAB_SHARED_DIR (default: <source>/../shared). FIXTURES: the CTest
# fixture its tests require (e.g. tiny_models, tests/CMakeLists.txt).
function(kvlab_add_test name)
  if(NOT KVLAB_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(ARG "" "LABELS;FIXTURES" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE
    KVLAB_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
    KVLAB_BINARY_DIR="${PROJECT_BINARY_DIR}")
  # (The paths come in as compile definitions: an ENVIRONMENT list here would be split at ';'.)
  set(properties)
  if(ARG_LABELS)
    list(APPEND properties LABELS "${ARG_LABELS}")
  endif()
  if(ARG_FIXTURES)
    list(APPEND properties FIXTURES_REQUIRED "${ARG_FIXTURES}")
  endif()
  if(properties)
    gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES ${properties})
  else()
    gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60)
  endif()
endfunction()

# kvlab_add_python_test(NAME SCRIPT [ARGS a b ...] [PROPERTIES key value ...])
# A test script (SCRIPT: relative to the source tree) run by Debian's /usr/bin/python3, whose
# numpy, torch, h5py, ... scripts/setup.sh installs. PROPERTIES go to set_tests_properties
# (single values only: a ';' list would be split).
function(kvlab_add_python_test name script)
  cmake_parse_arguments(ARG "" "" "ARGS;PROPERTIES" ${ARGN})
  add_test(NAME ${name} COMMAND /usr/bin/python3 ${PROJECT_SOURCE_DIR}/${script} ${ARG_ARGS})
  if(ARG_PROPERTIES)
    set_tests_properties(${name} PROPERTIES ${ARG_PROPERTIES})
  endif()
endfunction()
