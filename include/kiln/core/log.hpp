#pragma once
// TORCH_LOGS-style channels selected by KILN_LOGS, written to KILN_LOGS_OUT or stderr.
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>

#include "kiln/core/env.hpp"

namespace kiln {

/// Log channels that KILN_LOGS can switch on.
enum class LogChannel : unsigned {
  graph_breaks = 1u << 0,
  recompiles = 1u << 1,
  guards = 1u << 2,
  schedule = 1u << 3,
  output_code = 1u << 4,
  cache = 1u << 5,
  perf = 1u << 6,
  graph = 1u << 7,
};

namespace detail {

/// Every channel with the name KILN_LOGS spells it with: the one list that parsing, printing
/// and the warning for a misspelt name read.
struct ChannelName {
  LogChannel channel;
  const char* name;
};
inline constexpr ChannelName kLogChannels[] = {
    {LogChannel::graph_breaks, "graph_breaks"},
    {LogChannel::recompiles, "recompiles"},
    {LogChannel::guards, "guards"},
    {LogChannel::schedule, "schedule"},
    {LogChannel::output_code, "output_code"},
    {LogChannel::cache, "cache"},
    {LogChannel::perf, "perf"},
    {LogChannel::graph, "graph"},
};

/// The channel names, comma separated ("graph_breaks, recompiles, ...").
inline std::string valid_log_channels() {
  std::string all;
  for (const auto& c : kLogChannels) all += std::string(all.empty() ? "" : ", ") + c.name;
  return all + ", all";
}

/// Parses the KILN_LOGS syntax; a name that is no channel is reported on stderr with the
/// valid ones (a typo must not silently log nothing).
inline unsigned parse_log_channels(std::string_view spec) {
  unsigned mask = 0;
  while (!spec.empty()) {
    auto comma = spec.find(',');
    auto item = spec.substr(0, comma);
    while (!item.empty() && (item.front() == ' ' || item.front() == '+')) item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    bool known = item.empty();
    if (item == "all") {
      mask = ~0u;
      known = true;
    }
    for (const auto& c : kLogChannels)
      if (item == c.name) {
        mask |= unsigned(c.channel);
        known = true;
      }
    if (!known)
      std::fprintf(stderr, "kiln: warning: KILN_LOGS: unknown channel '%.*s' (valid: %s)\n",
                   static_cast<int>(item.size()), item.data(), valid_log_channels().c_str());
    if (comma == std::string_view::npos) break;
    spec.remove_prefix(comma + 1);
  }
  return mask;
}

struct LogState {
  unsigned mask = parse_log_channels(env::get("KILN_LOGS"));
  std::FILE* out = nullptr;
  std::mutex mu;
  LogState() {
    std::string path = env::get("KILN_LOGS_OUT");
    if (!path.empty()) out = std::fopen(path.c_str(), "a");
    if (!out) out = stderr;
  }
  ~LogState() {
    if (out && out != stderr) std::fclose(out);
  }
};

inline LogState& log_state() {
  static LogState state;
  return state;
}

inline const char* channel_name(LogChannel c) {
  for (const auto& n : kLogChannels)
    if (n.channel == c) return n.name;
  return "log";
}

}  // namespace detail

/// True when `channel` is on (cheap: one load and a mask).
inline bool log_enabled(LogChannel channel) { return (detail::log_state().mask & unsigned(channel)) != 0; }

/// Switches channels on from code, with the KILN_LOGS syntax ("" switches all off).
inline void set_logs(std::string_view spec) { detail::log_state().mask = detail::parse_log_channels(spec); }

/// Sends log lines to `out` (default: KILN_LOGS_OUT or stderr); the caller keeps it open.
inline void set_log_output(std::FILE* out) {
  auto& s = detail::log_state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.out = out ? out : stderr;
}

/// Writes one line "[kiln:channel] message" when the channel is on.
inline void log(LogChannel channel, std::string_view message) {
  if (!log_enabled(channel)) return;
  auto& s = detail::log_state();
  std::lock_guard<std::mutex> lock(s.mu);
  std::fprintf(s.out, "[kiln:%s] %.*s\n", detail::channel_name(channel), static_cast<int>(message.size()),
               message.data());
  std::fflush(s.out);
}

}  // namespace kiln
