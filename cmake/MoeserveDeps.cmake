# Third-party dependencies (architecture.md §6). Debian 12 packages; see .ci/run.
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
find_package(OpenMP REQUIRED)
find_package(fmt REQUIRED)
find_package(spdlog REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(tl-expected REQUIRED)
find_package(CLI11 REQUIRED)
find_package(GTest REQUIRED)

# OpenBLAS, OpenMP flavour: one OpenMP runtime with our kernels.
find_path(OPENBLAS_INCLUDE_DIR cblas.h PATHS /usr/include/x86_64-linux-gnu/openblas-openmp /usr/include/openblas
          PATH_SUFFIXES openblas-openmp)
find_library(OPENBLAS_LIBRARY NAMES openblas PATHS /usr/lib/x86_64-linux-gnu/openblas-openmp)
if(NOT OPENBLAS_INCLUDE_DIR OR NOT OPENBLAS_LIBRARY)
  message(FATAL_ERROR "OpenBLAS (libopenblas-openmp-dev) not found")
endif()
add_library(moeserve_openblas INTERFACE)
target_include_directories(moeserve_openblas INTERFACE ${OPENBLAS_INCLUDE_DIR})
target_link_libraries(moeserve_openblas INTERFACE ${OPENBLAS_LIBRARY})

pkg_check_modules(PCRE2 IMPORTED_TARGET libpcre2-8)
pkg_check_modules(XXHASH IMPORTED_TARGET libxxhash)
pkg_check_modules(ZMQ IMPORTED_TARGET libzmq)
pkg_check_modules(UTF8PROC IMPORTED_TARGET libutf8proc)
find_package(Boost 1.81 CONFIG COMPONENTS system)
