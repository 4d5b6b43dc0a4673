# Module layering: server -> engine -> kernels, enforced by the compiler.
#
# Sources include each other from the module root ("kernels/cpu/rmsnorm.h", "engine/model/gguf.h").
# The repository root is never an include directory. Instead each module gets an include root of its
# own, a folder holding one link to the module's sources, and a target sees only the roots of the
# modules it links. A kernels source that includes "engine/..." therefore fails to compile, and so does
# an engine source that includes "server/...". System libraries are checked by lmserve_check_includes():
# engine and kernels may not include gRPC, protobuf or prometheus-cpp headers.

set(LMSERVE_INCLUDE_ROOTS "${CMAKE_BINARY_DIR}/include_roots")

# lmserve_module_include_root(<module>) sets LMSERVE_<MODULE>_INCLUDE_ROOT to a folder that exposes
# only <module>/.
function(lmserve_module_include_root module)
  set(root "${LMSERVE_INCLUDE_ROOTS}/${module}")
  file(MAKE_DIRECTORY "${root}")
  if(NOT EXISTS "${root}/${module}")
    file(CREATE_LINK "${CMAKE_SOURCE_DIR}/${module}" "${root}/${module}" SYMBOLIC)
  endif()
  string(TOUPPER "${module}" upper)
  set(LMSERVE_${upper}_INCLUDE_ROOT "${root}" PARENT_SCOPE)
endfunction()

lmserve_module_include_root(common)
lmserve_module_include_root(kernels)
lmserve_module_include_root(engine)
lmserve_module_include_root(server)
lmserve_module_include_root(tests)
lmserve_module_include_root(bench)

# lmserve_check_includes(<target> <pattern>...) fails the build of <target> when one of its sources
# includes a header matching one of the regular expressions.
function(lmserve_check_includes target)
  get_target_property(sources ${target} SOURCES)
  get_target_property(source_dir ${target} SOURCE_DIR)
  set(files "")
  foreach(src IN LISTS sources)
    if(IS_ABSOLUTE "${src}")
      list(APPEND files "${src}")
    else()
      list(APPEND files "${source_dir}/${src}")
    endif()
  endforeach()
  file(GLOB_RECURSE headers "${source_dir}/*.h" "${source_dir}/*.cuh")
  list(APPEND files ${headers})
  set(stamp "${CMAKE_CURRENT_BINARY_DIR}/${target}_includes.stamp")
  add_custom_command(
    OUTPUT "${stamp}"
    COMMAND ${CMAKE_COMMAND} "-DSTAMP=${stamp}" "-DPATTERNS=${ARGN}" "-DFILES=${files}"
            -P "${CMAKE_SOURCE_DIR}/cmake/check_includes.cmake"
    DEPENDS ${files} "${CMAKE_SOURCE_DIR}/cmake/check_includes.cmake"
    COMMENT "Checking the includes of ${target}"
    VERBATIM)
  add_custom_target(${target}_includes DEPENDS "${stamp}")
  add_dependencies(${target} ${target}_includes)
endfunction()

set(LMSERVE_FORBIDDEN_BELOW_SERVER "^<grpc" "^<grpcpp/" "^<google/protobuf/" "^<prometheus/"
    "^<boost/asio" "^<boost/beast")
