// A rank of scripts/kiln-run's test (tests/distributed/launcher.sh): meets the other ranks
// through distributed::rendezvous_from_env and prints what it received, one line. With
// `fail R`, rank R exits with status 3 at once (the launcher must stop the others and pass
// the status on); with `hang`, rank 0 never serves (the others' rendezvous times out).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kiln/distributed/distributed.hpp"

int main(int argc, char** argv) {
  using namespace kiln::distributed;
  const std::string mode = argc > 1 ? argv[1] : "";
  RendezvousConfig config = rendezvous_from_env(std::chrono::seconds(30));
  if (mode == "fail" && argc > 2 && config.rank == std::atoi(argv[2])) return 3;
  const std::string blob = config.rank == 0 ? "id-of-" + std::to_string(::getpid()) : "";
  const std::string got = share_from_rank0(config, blob);
  std::printf("rank %d of %d local %d got %s\n", config.rank, config.world_size, config.local_rank, got.c_str());
  return 0;
}
