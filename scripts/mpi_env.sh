# Sourced by the scripts: what OpenMPI needs on this kind of machine.
# Running as root is refused unless asked for; 16 ranks on 2 cores need
# oversubscription; with many ranks per core each gets one BLAS thread; and
# mpirun's banners about non-zero exit codes would bury the report.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_orte_execute_quiet=1
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
