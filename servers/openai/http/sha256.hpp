// SPDX-License-Identifier: Apache-2.0
/// SHA-256 (FIPS 180-4) for API-key digests, and a constant-time digest comparison. Keys are never kept
/// in memory as text: the server stores their digests and compares the digest of each presented key
/// against every stored digest without early exit.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::server {

using Sha256Digest = std::array<uint8_t, 32>;

/// Incremental SHA-256: update() any number of times, then final() once.
class Sha256 {
 public:
  Sha256();
  void update(void const* data, size_t size);
  Sha256Digest final();

 private:
  void block(uint8_t const* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_bytes_ = 0;
};

Sha256Digest sha256(std::string_view data);
std::string to_hex(Sha256Digest const& d);
/// Compares all 32 bytes whatever the first difference (no data-dependent branch).
bool digests_equal(Sha256Digest const& a, Sha256Digest const& b);

}  // namespace tessera::server
