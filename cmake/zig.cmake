# Toolchain of the manylinux wheels (make wheel): zig's clang and libc++ (linked statically) against an old glibc.
# QUEST_ZIG_TARGET is zig's target, e.g. x86_64-linux-gnu.2.28 or aarch64-linux-gnu.2.28: the glibc version after
# the triple is the newest glibc the library may need, so the wheel installs on every system with that glibc or a
# newer one. No sysroot is needed: zig carries the headers and link stubs of every glibc version.
set(QUEST_ZIG_TARGET "" CACHE STRING "zig's target: <arch>-linux-gnu.<glibc version>")
if(NOT QUEST_ZIG_TARGET MATCHES "^(x86_64|aarch64)-linux-gnu\\.2\\.[0-9]+$")
  message(FATAL_ERROR "cmake/zig.cmake needs -DQUEST_ZIG_TARGET=<x86_64|aarch64>-linux-gnu.2.<minor> "
                      "(the glibc to build against), not '${QUEST_ZIG_TARGET}'")
endif()
# try_compile projects read this file again: they need the same target.
list(APPEND CMAKE_TRY_COMPILE_PLATFORM_VARIABLES QUEST_ZIG_TARGET)
set(QUEST_ZIG ON)

set(CMAKE_SYSTEM_NAME Linux)
string(REGEX MATCH "^[^-]+" CMAKE_SYSTEM_PROCESSOR "${QUEST_ZIG_TARGET}")
set(_zig_tools "${CMAKE_CURRENT_LIST_DIR}/zig")
if(NOT DEFINED ENV{QUEST_ZIG_PYTHON})
  message(FATAL_ERROR "cmake/zig.cmake: set QUEST_ZIG_PYTHON to a Python that has the ziglang package "
                      "(pip install ziglang); make wheel sets it to .venv/bin/python")
endif()
set(CMAKE_CXX_COMPILER "${_zig_tools}/c++")
set(CMAKE_CXX_COMPILER_TARGET "${QUEST_ZIG_TARGET}")
set(CMAKE_AR "${_zig_tools}/ar" CACHE FILEPATH "zig's ar")
set(CMAKE_RANLIB "${_zig_tools}/ranlib" CACHE FILEPATH "zig's ranlib")
