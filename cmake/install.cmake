# `cmake --install`: the llmq program, both libraries, the public headers (include/llmq plus the
# generated version.hpp), a CMake package and a pkg-config file.
#
#   find_package(llmq 0.1 REQUIRED)            targets llmq::llmq (shared) and llmq::llmq_static
#   pkg-config --cflags --libs llmq            the shared library
#
# The package finds again what the libraries need from the consumer's side (llmqConfig.cmake.in):
# nlohmann-json always (a public header includes it); for the static library ICU, cpp-httplib and,
# in a CUDA build, the CUDA toolkit's targets.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(LLMQ_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/llmq)
install(TARGETS llmq_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS llmq llmq_shared EXPORT llmqTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/llmq DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.hpp")
install(FILES ${LLMQ_GENERATED_INCLUDE}/llmq/version.hpp DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/llmq)
install(EXPORT llmqTargets NAMESPACE llmq:: DESTINATION ${LLMQ_INSTALL_CMAKEDIR})

configure_package_config_file(cmake/llmqConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/llmqConfig.cmake
                              INSTALL_DESTINATION ${LLMQ_INSTALL_CMAKEDIR})
# 0.x releases promise nothing across minor versions: a request for 0.1 accepts 0.1.z only.
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/llmqConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/llmqConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/llmqConfigVersion.cmake
        DESTINATION ${LLMQ_INSTALL_CMAKEDIR})

# pkg-config: the static library's private dependencies, as pkg-config names them (Debian's .pc
# files for ICU and cpp-httplib) or as linker flags (the CUDA toolkit ships none).
set(LLMQ_PC_LIBS_PRIVATE "")
set(LLMQ_PC_CFLAGS "")
if(LLMQ_HAVE_CUDA)
  set(LLMQ_PC_LIBS_PRIVATE "-Wl,-rpath,${CUDAToolkit_LIBRARY_DIR} -L${CUDAToolkit_LIBRARY_DIR} -lcublasLt -lcudart_static -lrt -lpthread -ldl")
  set(LLMQ_PC_CFLAGS "-DLLMQ_WITH_CUDA=1")
endif()
# The file names its prefix relative to where it lies (${pcfiledir}), so that `cmake --install
# --prefix DIR` (a prefix chosen after configuring) gets a file that points into DIR.
file(RELATIVE_PATH LLMQ_PC_PREFIX_FROM_PCDIR /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
configure_file(cmake/llmq.pc.in ${CMAKE_CURRENT_BINARY_DIR}/llmq.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/llmq.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
