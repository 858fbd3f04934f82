#pragma once
// KILN_LOGS=output_code: the kernels of a generated unit, not the helpers every unit carries
// (vector math, Philox, half conversions: hundreds of lines), with the whole source kept in a
// file under the cache directory that the log line names and that outlives the process.
#include <string>

#include "kiln/core/generated.hpp"
#include "kiln/core/log.hpp"
#include "kiln/runtime/disk_cache.hpp"
#include "kiln/core/linkage.hpp"

KILN_COLD_CODE_BEGIN

namespace kiln::runtime {

/// Logs `source` on output_code as `title`: the whole source is kept as `sources/<tag><ext>`
/// under the cache directory (else the scratch directory), the log holds what follows the
/// marker and a line saying how many prelude lines it left out.
inline void log_output_code(const DiskCache* disk, const std::string& title, const std::string& tag, const char* ext,
                            const std::string& source) {
  if (!log_enabled(LogChannel::output_code)) return;
  std::string dir = disk && disk->enabled() ? disk->dir() + "/sources" : scratch_dir() + "/sources";
  std::string path = dir + "/kiln_" + tag + ext;
  std::string kept = "not kept";
  if (detail::make_dirs(dir, 0700)) {
    std::string tmp = path + "." + detail::unique_suffix() + ".tmp";
    if (detail::write_new_file(tmp, source) && ::rename(tmp.c_str(), path.c_str()) == 0)
      kept = path;
    else
      ::unlink(tmp.c_str());
  }
  const std::size_t at = source.find(kiln::detail::kKernelsBeginMarker);
  std::string shown = source;
  std::string note;
  if (at != std::string::npos) {
    std::size_t lines = 0;
    for (std::size_t i = 0; i < at; ++i) lines += source[i] == '\n';
    shown = source.substr(at + std::char_traits<char>::length(kiln::detail::kKernelsBeginMarker));
    note = "; its prelude of " + std::to_string(lines) +
           " lines (kiln's math, Philox and conversion helpers) left out here";
  }
  log(LogChannel::output_code, title + " (source: " + kept + note + "):\n" + shown);
}

}  // namespace kiln::runtime

KILN_COLD_CODE_END
