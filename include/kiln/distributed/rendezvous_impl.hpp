#pragma once
// The rendezvous (rendezvous.hpp): rank 0's blob to every rank over TCP or a shared file. Part of
// distributed_impl.hpp (compiled once in compiled mode).
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kiln/core/env.hpp"
#include "kiln/core/error.hpp"
#include "kiln/distributed/deadline.hpp"
#include "kiln/distributed/rendezvous.hpp"

namespace kiln::distributed {
namespace detail {

// ---- rendezvous --------------------------------------------------------------------------------

inline int env_int(const char* name, std::optional<int> fallback) {
  const std::string v = env::get(name);
  if (v.empty()) {
    if (fallback) return *fallback;
    throw ValueError(std::string("distributed: the environment variable ") + name +
                     " is not set (start the job with scripts/kiln-run, or set RANK, WORLD_SIZE and MASTER_PORT)");
  }
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (errno != 0 || end == v.c_str() || *end != '\0' || x < 0 || x > 1 << 30)
    throw ValueError(std::string("distributed: ") + name + "='" + v + "' is not a non-negative integer");
  return static_cast<int>(x);
}

/// A socket closed when it goes out of scope.
struct Socket {
  int fd = -1;
  Socket() = default;
  explicit Socket(int f) : fd(f) {}
  Socket(Socket&& o) noexcept : fd(std::exchange(o.fd, -1)) {}
  Socket& operator=(Socket&& o) noexcept {
    if (this != &o) {
      if (fd >= 0) ::close(fd);
      fd = std::exchange(o.fd, -1);
    }
    return *this;
  }
  ~Socket() {
    if (fd >= 0) ::close(fd);
  }
};

inline std::string errno_text() { return std::strerror(errno); }

/// Waits until `fd` is readable (or writable), at most until `deadline`; false on timeout.
inline bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
  }
}

/// Reads exactly `n` bytes before `deadline`; false on timeout or a closed connection.
inline bool read_exact(int fd, void* buf, std::size_t n, Clock::time_point deadline) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    if (!wait_fd(fd, POLLIN, deadline)) return false;
    const ssize_t got = ::recv(fd, p, n, 0);
    if (got == 0) return false;
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return false;
    }
    p += got;
    n -= static_cast<std::size_t>(got);
  }
  return true;
}

inline bool write_all(int fd, const void* buf, std::size_t n) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t put = ::send(fd, p, n, MSG_NOSIGNAL);
    if (put < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return false;
    }
    p += put;
    n -= static_cast<std::size_t>(put);
  }
  return true;
}

/// What a non-zero rank says when it connects: who it is and which job it belongs to.
inline std::string hello_of(const RendezvousConfig& c) {
  return "kiln-rendezvous rank=" + std::to_string(c.rank) + " world=" + std::to_string(c.world_size) +
         " run=" + c.run_id + "\n";
}

inline void send_framed(int fd, const std::string& s) {
  const std::uint64_t n = s.size();
  if (!write_all(fd, &n, sizeof n) || !write_all(fd, s.data(), s.size()))
    throw DistributedError("distributed: rendezvous: send failed: " + errno_text());
}

inline bool recv_framed(int fd, std::string& s, Clock::time_point deadline, std::size_t limit = 1 << 20) {
  std::uint64_t n = 0;
  if (!read_exact(fd, &n, sizeof n, deadline) || n > limit) return false;
  s.resize(static_cast<std::size_t>(n));
  return read_exact(fd, s.data(), s.size(), deadline);
}

inline std::string tcp_where(const RendezvousConfig& c) { return c.master_addr + ":" + std::to_string(c.master_port); }

inline std::string serve_rank0(const RendezvousConfig& c, const std::string& blob) {
  const auto deadline = Clock::now() + c.timeout;
  Socket listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (listener.fd < 0) throw DistributedError("distributed: rendezvous: socket() failed: " + errno_text());
  const int yes = 1;
  ::setsockopt(listener.fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<std::uint16_t>(c.master_port));
  if (::bind(listener.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    throw DistributedError("distributed: rendezvous: rank 0 cannot listen on port " + std::to_string(c.master_port) +
                           ": " + errno_text() + " (is another job using MASTER_PORT?)");
  if (::listen(listener.fd, c.world_size) != 0)
    throw DistributedError("distributed: rendezvous: listen() failed: " + errno_text());
  std::vector<bool> served(static_cast<std::size_t>(c.world_size), false);
  served[0] = true;
  const std::string expected_tail = " world=" + std::to_string(c.world_size) + " run=" + c.run_id + "\n";
  for (int done = 1; done < c.world_size;) {
    if (!wait_fd(listener.fd, POLLIN, deadline)) {
      std::string missing;
      for (int r = 0; r < c.world_size; ++r)
        if (!served[static_cast<std::size_t>(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      throw DistributedError("distributed: rendezvous: rank 0 waited " + ms_text(c.timeout) + " on port " +
                             std::to_string(c.master_port) + " for rank(s) " + missing + ", which did not connect");
    }
    Socket peer(::accept4(listener.fd, nullptr, nullptr, SOCK_CLOEXEC));
    if (peer.fd < 0) continue;
    std::string hello;
    if (!recv_framed(peer.fd, hello, deadline, 4096)) continue;  // not one of ours, or gone: keep listening
    int rank = -1;
    if (std::sscanf(hello.c_str(), "kiln-rendezvous rank=%d", &rank) != 1 || rank <= 0 || rank >= c.world_size ||
        hello.size() < expected_tail.size() ||
        hello.compare(hello.size() - expected_tail.size(), expected_tail.size(), expected_tail) != 0) {
      send_framed(peer.fd, "refused: rank 0 expects world=" + std::to_string(c.world_size) + " run=" + c.run_id +
                               ", got: " + hello);
      continue;
    }
    if (served[static_cast<std::size_t>(rank)]) {
      send_framed(peer.fd, "refused: rank " + std::to_string(rank) + " already joined");
      continue;
    }
    send_framed(peer.fd, "ok");
    send_framed(peer.fd, blob);
    served[static_cast<std::size_t>(rank)] = true;
    ++done;
  }
  return blob;
}

inline std::string join_rank0(const RendezvousConfig& c) {
  const auto deadline = Clock::now() + c.timeout;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(c.master_port);
  if (const int e = ::getaddrinfo(c.master_addr.c_str(), port.c_str(), &hints, &found); e != 0)
    throw DistributedError("distributed: rendezvous: cannot resolve MASTER_ADDR '" + c.master_addr +
                           "': " + ::gai_strerror(e));
  sockaddr_in addr{};
  std::memcpy(&addr, found->ai_addr, sizeof addr);
  ::freeaddrinfo(found);
  std::string last = "no attempt";
  while (Clock::now() < deadline) {
    Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (s.fd < 0) throw DistributedError("distributed: rendezvous: socket() failed: " + errno_text());
    if (::connect(s.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      last = errno_text();  // rank 0 not listening yet: try again shortly
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    send_framed(s.fd, hello_of(c));
    std::string status, blob;
    if (!recv_framed(s.fd, status, deadline)) {
      last = "rank 0 closed the connection";
      continue;
    }
    if (status != "ok") throw DistributedError("distributed: rendezvous at " + tcp_where(c) + ": " + status);
    if (!recv_framed(s.fd, blob, deadline)) {
      last = "rank 0 closed the connection before sending the id";
      continue;
    }
    return blob;
  }
  throw DistributedError("distributed: rendezvous: rank " + std::to_string(c.rank) + " could not reach rank 0 at " +
                         tcp_where(c) + " within " + ms_text(c.timeout) + " (last: " + last + ")");
}

inline std::string file_header(const RendezvousConfig& c) {
  return "kiln-rendezvous world=" + std::to_string(c.world_size) + " run=" + c.run_id + "\n";
}

inline std::string share_through_file(const RendezvousConfig& c, const std::string& blob) {
  const std::string header = file_header(c);
  if (c.rank == 0) {
    const std::string tmp = c.file + ".tmp." + std::to_string(::getpid());
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << header << blob;
      if (!out) throw DistributedError("distributed: rendezvous: cannot write '" + tmp + "'");
    }
    if (std::rename(tmp.c_str(), c.file.c_str()) != 0)
      throw DistributedError("distributed: rendezvous: cannot move '" + tmp + "' to '" + c.file + "': " + errno_text());
    return blob;
  }
  const auto deadline = Clock::now() + c.timeout;
  while (Clock::now() < deadline) {
    std::ifstream in(c.file, std::ios::binary);
    if (in) {
      std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (all.compare(0, header.size(), header) == 0) return all.substr(header.size());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  throw DistributedError("distributed: rendezvous: rank " + std::to_string(c.rank) + " waited " + ms_text(c.timeout) +
                         " for rank 0 to write '" + c.file + "' for world " + std::to_string(c.world_size) + ", run '" +
                         c.run_id + "'");
}

}  // namespace detail

KILN_ENTRY RendezvousConfig rendezvous_from_env(std::chrono::milliseconds timeout) {
  RendezvousConfig c;
  c.rank = detail::env_int("RANK", std::nullopt);
  c.world_size = detail::env_int("WORLD_SIZE", std::nullopt);
  if (c.world_size < 1 || c.rank >= c.world_size)
    throw ValueError("distributed: RANK=" + std::to_string(c.rank) +
                     " is not a rank of WORLD_SIZE=" + std::to_string(c.world_size));
  c.local_rank = detail::env_int("LOCAL_RANK", c.rank);
  c.file = env::get("KILN_RENDEZVOUS_FILE");
  c.master_addr = env::get("MASTER_ADDR", "127.0.0.1");
  c.master_port = c.file.empty() && c.world_size > 1 ? detail::env_int("MASTER_PORT", std::nullopt) : 0;
  if (c.master_port > 65535)
    throw ValueError("distributed: MASTER_PORT=" + std::to_string(c.master_port) + " is not a port");
  c.run_id = env::get("KILN_RUN_ID");
  c.timeout = timeout;
  return c;
}

KILN_ENTRY std::string share_from_rank0(const RendezvousConfig& config, const std::string& blob) {
  if (config.world_size < 1 || config.rank < 0 || config.rank >= config.world_size)
    throw ValueError("distributed: rendezvous: rank " + std::to_string(config.rank) + " is not a rank of a world of " +
                     std::to_string(config.world_size));
  if (config.world_size == 1) return blob;
  if (!config.file.empty()) return detail::share_through_file(config, blob);
  if (config.master_port <= 0 || config.master_port > 65535)
    throw ValueError("distributed: rendezvous: no KILN_RENDEZVOUS_FILE and no valid MASTER_PORT (" +
                     std::to_string(config.master_port) + ")");
  return config.rank == 0 ? detail::serve_rank0(config, blob) : detail::join_rank0(config);
}

}  // namespace kiln::distributed
