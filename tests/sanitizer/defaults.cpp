// Sanitizer settings of the sanitized unit and MPI tests (DIFFCHECK_SANITIZE),
// compiled into the test binaries so that no environment has to reach them
// through ctest and mpirun. Any report ends the test with a failure.
//
// Leaks: what the HDF5 runtime keeps until exit is its own, not ours (the
// suppressions below). Under MPI, leak checking is off (the MPI tests define
// DIFFCHECK_SANITIZE_NO_LEAKS): OpenMPI unloads its components at
// MPI_Finalize, so their allocations show as leaks from "<unknown module>"
// that no suppression can name. The unit tests run the same store and check
// code with leak checking on.
extern "C" {

const char* __asan_default_options() {
#ifdef DIFFCHECK_SANITIZE_NO_LEAKS
  return "detect_leaks=0:halt_on_error=1";
#else
  return "detect_leaks=1:halt_on_error=1";
#endif
}

const char* __ubsan_default_options() { return "halt_on_error=1:print_stacktrace=1"; }

const char* __lsan_default_suppressions() {
  return "leak:libmpi.so\n"
         "leak:libopen-pal.so\n"
         "leak:libopen-rte.so\n"
         "leak:libpmix.so\n"
         "leak:libhwloc.so\n"
         "leak:libevent\n"
         "leak:libhdf5\n"
         "leak:^H5\n"  // HDF5's own functions, when linked from its static archive
         "leak:mca_\n";
}

}  // extern "C"
