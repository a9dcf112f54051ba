// SPDX-License-Identifier: Apache-2.0
/// Process-group bootstrap in the torchrun convention: every process reads RANK, WORLD_SIZE, LOCAL_RANK
/// (default RANK), MASTER_ADDR and MASTER_PORT from its environment; rank 0 listens on
/// MASTER_ADDR:MASTER_PORT (TCP), every other rank connects and sends its rank (4 bytes, little endian),
/// and rank 0 answers each with the same blob (a 4-byte length, then the bytes): for NCCL the 128-byte
/// ncclUniqueId. Plain POSIX sockets; no GPU involved, so it is tested on the CPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/core/status.hpp"

namespace tessera::dist {

struct LaunchEnv {
  int rank = 0, world_size = 1, local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};

/// Reads and validates the variables above; an error names the variable and its value.
Result<LaunchEnv> launch_env_from_environment();

/// Rank 0 sends `blob` to every other rank; every rank returns the blob. Ranks retry connecting until
/// `timeout_s`; rank 0 waits that long for all peers. Errors name the address, port and rank.
Result<std::vector<uint8_t>> tcp_rendezvous(LaunchEnv const& env, std::vector<uint8_t> const& blob, double timeout_s);

}  // namespace tessera::dist
