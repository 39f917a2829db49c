// Catch2's runner inside MPI: every rank runs every test case (the cases' collectives line up);
// the program fails when any rank fails.
#define CATCH_CONFIG_RUNNER
#include <remat/parallel/mpi.hpp>

#include <catch2/catch.hpp>

int main(int argc, char** argv) {
  remat::dist::environment env(argc, argv);
  int const failed = Catch::Session().run(argc, argv);
  int any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any ? 1 : 0;
}
