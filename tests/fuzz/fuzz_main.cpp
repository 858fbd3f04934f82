// kiln_fuzz: the differential fuzzer's driver. Generates graphs [first, first + graphs) of
// campaign `seed`, judges each (JIT against the reference executor and the float64 twin),
// shrinks what fails and writes the shrunk programs as doctest cases.
//
//   kiln_fuzz --graphs 300 --seed 1 --jobs 2          # the CI window (tests/CMakeLists.txt)
//   kiln_fuzz --graphs 100000 --device cuda --seed 7 --out repro/
//   kiln_fuzz --seed 7 --print 123                    # graph 123 as C++
//   kiln_fuzz --seed 7 --one 123                      # judge graph 123 in this process, verbosely
//   kiln_fuzz --graphs 300 --seed 1 --grad            # each graph with its gradients (the backward judged too)
//
// Graphs run in worker processes (fork) so that a crash or a hang costs one graph, not the
// campaign: a worker that dies mid-graph is replaced and the graph is recorded as a crash. The
// parent process never evaluates a tensor itself (GNU OpenMP is not fork-safe once used).
#include <execinfo.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include "probes.hpp"
#include "shrink.hpp"

using namespace kiln;
using namespace kiln::fuzz;

namespace {

struct Options {
  std::uint64_t seed = 1;
  std::uint64_t first = 0;
  std::uint64_t graphs = 100;
  std::string device = "cpu";
  int jobs = 1;
  std::string out;
  double shrink_seconds = 120;
  int shrink_max = 12;
  double graph_timeout = 300;
  bool fork = true;
  bool fail_on_find = true;
  bool selftest = false;
  long print = -1, one = -1;
  Limits lim;
};

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr,
               "%s\nusage: kiln_fuzz [--graphs N] [--seed S] [--first I] [--device cpu|cuda] [--jobs J]\n"
               "  [--max-ops K] [--max-elems E] [--out DIR] [--shrink-seconds T] [--shrink-max N]\n"
               "  [--graph-timeout T] [--no-fork] [--no-fail] [--selftest] [--print I] [--one I]\n"
               "  [--table-version V] [--grad]\n",
               msg);
  std::exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value after " + a).c_str());
      return argv[++i];
    };
    if (a == "--graphs")
      o.graphs = std::stoull(val());
    else if (a == "--seed")
      o.seed = std::stoull(val());
    else if (a == "--first")
      o.first = std::stoull(val());
    else if (a == "--device")
      o.device = val();
    else if (a == "--jobs")
      o.jobs = std::max(1, std::stoi(val()));
    else if (a == "--max-ops")
      o.lim.max_ops = std::stoi(val());
    else if (a == "--table-version")
      o.lim.table_version = std::stoi(val());
    else if (a == "--max-elems")
      o.lim.max_elems = std::stoll(val());
    else if (a == "--out")
      o.out = val();
    else if (a == "--shrink-seconds")
      o.shrink_seconds = std::stod(val());
    else if (a == "--shrink-max")
      o.shrink_max = std::stoi(val());
    else if (a == "--no-shrink")
      o.shrink_max = 0;
    else if (a == "--graph-timeout")
      o.graph_timeout = std::stod(val());
    else if (a == "--no-fork")
      o.fork = false;
    else if (a == "--no-fail")
      o.fail_on_find = false;
    else if (a == "--selftest")
      o.selftest = true, o.shrink_max = 0;
    else if (a == "--print")
      o.print = std::stol(val());
    else if (a == "--one")
      o.one = std::stol(val());
    else if (a == "--grad")
      o.lim.grad = true;
    else
      usage(("unknown option " + a).c_str());
  }
  if (o.device != "cpu" && o.device != "cuda" && o.device.rfind("cuda:", 0) != 0)
    usage("--device must be cpu or cuda[:N]");
  return o;
}

/// The options a graph's generation depends on beyond --seed, as kiln_fuzz spells them (empty
/// where they are the defaults): what a reproducer's "--one N" needs to regenerate the graph.
std::string generation_flags(const Options& o) {
  const Limits d;
  std::string f;
  if (o.lim.max_ops != d.max_ops) f += " --max-ops " + std::to_string(o.lim.max_ops);
  if (o.lim.max_elems != d.max_elems) f += " --max-elems " + std::to_string(o.lim.max_elems);
  if (o.lim.table_version != d.table_version) f += " --table-version " + std::to_string(o.lim.table_version);
  if (o.lim.grad) f += " --grad";
  return f;
}

Device device_of(const std::string& s) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  return Device::cuda(std::stoi(s.substr(5)));
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// ---- verdicts across processes ----------------------------------------------------------------

std::string escape(const std::string& s, std::size_t limit = 4000) {
  std::string o;
  for (char c : s.substr(0, limit)) {
    if (c == '\n')
      o += "\\n";
    else if (c == '\t')
      o += ' ';
    else if (c == '\\')
      o += "\\\\";
    else
      o += c;
  }
  return o;
}
std::string unescape(const std::string& s) {
  std::string o;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      o += s[i + 1] == 'n' ? '\n' : s[i + 1];
      ++i;
    } else {
      o += s[i];
    }
  }
  return o;
}

bool write_all(int fd, const std::string& s) {
  std::size_t done = 0;
  while (done < s.size()) {
    ssize_t w = ::write(fd, s.data() + done, s.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    done += static_cast<std::size_t>(w);
  }
  return true;
}

/// Judges `p`, never throwing: an exception escaping the checker is itself a finding.
Verdict safe_check(const Program& p, Device dev, bool selftest = false) {
  try {
    return check_program(p, dev, selftest);
  } catch (const std::exception& e) {
    Verdict v;
    v.kind = Kind::EvalError;
    v.detail = error_type(e) + ": escaped the checker: " + e.what();
    return v;
  }
}

std::string signal_name(int sig) {
  const char* n = strsignal(sig);
  return std::string("signal ") + std::to_string(sig) + " (" + (n ? n : "?") + ")";
}

/// --one's crash report: the stack of the faulting thread on stderr, then the default action
/// (so the exit status still says which signal). Symbols need -rdynamic (ENABLE_EXPORTS).
void print_stack_on_crash() {
  auto handler = [](int sig) {
    void* frames[64];
    const int n = ::backtrace(frames, 64);
    const char* head = "kiln_fuzz: crashed; the stack:\n";
    [[maybe_unused]] auto w = ::write(2, head, std::strlen(head));
    ::backtrace_symbols_fd(frames, n, 2);
    ::signal(sig, SIG_DFL);
    ::raise(sig);
  };
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) ::signal(sig, handler);
}

/// Runs fn in a child process; the parent gets its verdict, or Crash/Timeout.
Verdict in_child(const std::function<Verdict()>& fn, double timeout) {
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    Verdict v = fn();
    write_all(fds[1], std::to_string(static_cast<int>(v.kind)) + "\t" + escape(v.detail) + "\n");
    std::fflush(nullptr);
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string buf;
  double start = now_s();
  bool timed_out = false;
  for (;;) {
    pollfd pf{fds[0], POLLIN, 0};
    int r = ::poll(&pf, 1, 1000);
    if (r > 0) {
      char tmp[4096];
      ssize_t n = ::read(fds[0], tmp, sizeof tmp);
      if (n <= 0) break;
      buf.append(tmp, static_cast<std::size_t>(n));
    }
    if (now_s() - start > timeout) {
      ::kill(pid, SIGKILL);
      timed_out = true;
      break;
    }
  }
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  Verdict v;
  if (timed_out) {
    v.kind = Kind::Timeout;
    v.detail = "timeout: more than " + std::to_string(static_cast<int>(timeout)) + " s";
  } else if (WIFSIGNALED(status)) {
    v.kind = Kind::Crash;
    v.detail = "crash: " + signal_name(WTERMSIG(status));
  } else if (auto tab = buf.find('\t'); tab != std::string::npos) {
    v.kind = static_cast<Kind>(std::stoi(buf.substr(0, tab)));
    std::string d = buf.substr(tab + 1);
    if (!d.empty() && d.back() == '\n') d.pop_back();
    v.detail = unescape(d);
  } else {
    v.kind = Kind::Crash;
    v.detail = "crash: the child exited (status " + std::to_string(WEXITSTATUS(status)) + ") without a verdict";
  }
  return v;
}

// ---- the campaign ----------------------------------------------------------------------------

struct Record {
  std::uint64_t index = 0;
  Verdict verdict;
  int compiles = 0;
  double seconds = 0;
};

/// The first lines of a finding's detail that say what went wrong (a compiler's error lines,
/// not its command line).
std::string headline(const std::string& d, std::size_t limit = 600) {
  std::istringstream is(d);
  std::string out, line;
  bool first = true;
  while (std::getline(is, line)) {
    bool keep = first || line.find("error:") != std::string::npos;
    if (keep) {
      if (!first) {
        auto e = line.find("error:");
        line = "  " + line.substr(e);
      }
      out += (first ? "" : "\n") + line;
    }
    first = false;
  }
  return out.substr(0, limit);
}

/// One worker: judges its graphs in order, reporting "B i" before and "R i kind compiles secs\tdetail" after each.
[[noreturn]] void worker_main(int fd, const Options& o, const std::vector<std::uint64_t>& todo, std::size_t from) {
  Device dev = device_of(o.device);
  for (std::size_t k = from; k < todo.size(); ++k) {
    std::uint64_t i = todo[k];
    write_all(fd, "B " + std::to_string(i) + "\n");
    Program p = generate(o.seed, i, o.lim);
    std::uint64_t c0 = stats().compiles;
    double t0 = now_s();
    Verdict v = safe_check(p, dev, o.selftest);
    Verdict pv = run_probe(static_cast<std::size_t>(i), o.seed, i);
    write_all(fd, "P " + std::to_string(i) + " " + std::to_string(static_cast<int>(pv.kind)) + "\t" +
                      escape(pv.detail) + "\n");
    write_all(fd, "R " + std::to_string(i) + " " + std::to_string(static_cast<int>(v.kind)) + " " +
                      std::to_string(stats().compiles - c0) + " " + std::to_string(now_s() - t0) + " " +
                      std::to_string(v.excused) + "\t" + escape(v.detail) + "\n");
  }
  std::fflush(nullptr);
  ::_exit(0);
}

struct Worker {
  pid_t pid = -1;
  int fd = -1;
  std::string buf;
  std::vector<std::uint64_t> todo;
  std::size_t pos = 0;  // todo[pos] is the graph in progress (or next)
  bool busy = false;
  double started = 0;
  bool killed = false;
};

void start_worker(Worker& w, const Options& o) {
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    worker_main(fds[1], o, w.todo, w.pos);
  }
  ::close(fds[1]);
  w.pid = pid;
  w.fd = fds[0];
  w.buf.clear();
  w.busy = false;
  w.killed = false;
}

/// Error probes that failed, and how many ran.
std::vector<Record> g_probe_failures;
std::size_t g_probes = 0;

std::vector<Record> run_campaign(const Options& o) {
  std::vector<Record> records;
  std::vector<Worker> workers(static_cast<std::size_t>(o.jobs));
  for (std::uint64_t i = 0; i < o.graphs; ++i) workers[i % workers.size()].todo.push_back(o.first + i);
  double t0 = now_s();
  std::size_t done = 0, bugs = 0, next_report = 50;
  auto record = [&](Record r) {
    ++done;
    if (is_bug(r.verdict.kind)) {
      ++bugs;
      std::printf("graph %llu: %s: %s\n", static_cast<unsigned long long>(r.index), kind_name(r.verdict.kind),
                  headline(r.verdict.detail, 300).c_str());
    }
    if (done >= next_report) {
      std::printf("[%zu/%llu] %zu findings, %.0f s\n", done, static_cast<unsigned long long>(o.graphs), bugs,
                  now_s() - t0);
      next_report += 50;
    }
    std::fflush(stdout);
    records.push_back(std::move(r));
  };
  for (auto& w : workers)
    if (!w.todo.empty()) start_worker(w, o);
  for (;;) {
    std::vector<pollfd> pfs;
    std::vector<Worker*> ws;
    for (auto& w : workers)
      if (w.fd >= 0) {
        pfs.push_back({w.fd, POLLIN, 0});
        ws.push_back(&w);
      }
    if (pfs.empty()) break;
    ::poll(pfs.data(), pfs.size(), 1000);
    for (std::size_t k = 0; k < pfs.size(); ++k) {
      Worker& w = *ws[k];
      if (pfs[k].revents & (POLLIN | POLLHUP | POLLERR)) {
        char tmp[8192];
        ssize_t n = ::read(w.fd, tmp, sizeof tmp);
        if (n > 0) {
          w.buf.append(tmp, static_cast<std::size_t>(n));
          for (std::size_t nl; (nl = w.buf.find('\n')) != std::string::npos;) {
            std::string line = w.buf.substr(0, nl);
            w.buf.erase(0, nl + 1);
            if (line.rfind("P ", 0) == 0) {
              std::istringstream is(line.substr(2, line.find('\t') - 2));
              Record r;
              int kind = 0;
              is >> r.index >> kind;
              r.verdict.kind = static_cast<Kind>(kind);
              r.verdict.detail = unescape(line.substr(line.find('\t') + 1));
              ++g_probes;
              if (r.verdict.kind != Kind::Pass) {
                std::printf("probe %llu: %s\n", static_cast<unsigned long long>(r.index),
                            r.verdict.detail.substr(0, 300).c_str());
                g_probe_failures.push_back(r);
              }
            } else if (line.rfind("B ", 0) == 0) {
              w.busy = true;
              w.started = now_s();
            } else if (line.rfind("R ", 0) == 0) {
              std::istringstream is(line.substr(2, line.find('\t') - 2));
              Record r;
              int kind = 0;
              is >> r.index >> kind >> r.compiles >> r.seconds >> r.verdict.excused;
              r.verdict.kind = static_cast<Kind>(kind);
              r.verdict.detail = unescape(line.substr(line.find('\t') + 1));
              record(r);
              w.busy = false;
              ++w.pos;
            }
          }
        } else {
          // The worker is gone: finished, crashed mid-graph, or killed for a timeout.
          ::close(w.fd);
          w.fd = -1;
          int status = 0;
          ::waitpid(w.pid, &status, 0);
          if (w.busy) {
            Record r;
            r.index = w.todo[w.pos];
            r.verdict.kind = w.killed ? Kind::Timeout : Kind::Crash;
            r.verdict.detail = w.killed
                                   ? "timeout: more than " + std::to_string(static_cast<int>(o.graph_timeout)) + " s"
                               : WIFSIGNALED(status) ? "crash: " + signal_name(WTERMSIG(status))
                                                     : "crash: the worker exited mid-graph";
            r.seconds = now_s() - w.started;
            record(r);
            ++w.pos;
          }
          if (w.pos < w.todo.size()) start_worker(w, o);
        }
      }
      if (w.fd >= 0 && w.busy && !w.killed && now_s() - w.started > o.graph_timeout) {
        ::kill(w.pid, SIGKILL);
        w.killed = true;
      }
    }
  }
  std::sort(records.begin(), records.end(), [](const Record& a, const Record& b) { return a.index < b.index; });
  return records;
}

std::vector<Record> run_in_process(const Options& o) {
  std::vector<Record> records;
  Device dev = device_of(o.device);
  for (std::uint64_t i = o.first; i < o.first + o.graphs; ++i) {
    Program p = generate(o.seed, i, o.lim);
    Record r;
    r.index = i;
    std::uint64_t c0 = stats().compiles;
    double t0 = now_s();
    r.verdict = safe_check(p, dev, o.selftest);
    r.compiles = static_cast<int>(stats().compiles - c0);
    Record pr;
    pr.index = i;
    pr.verdict = run_probe(static_cast<std::size_t>(i), o.seed, i);
    ++g_probes;
    if (pr.verdict.kind != Kind::Pass) g_probe_failures.push_back(pr);
    r.seconds = now_s() - t0;
    if (is_bug(r.verdict.kind))
      std::printf("graph %llu: %s: %s\n", static_cast<unsigned long long>(i), kind_name(r.verdict.kind),
                  headline(r.verdict.detail, 300).c_str());
    std::fflush(stdout);
    records.push_back(r);
  }
  return records;
}

std::set<std::string> op_names(const Program& p) {
  std::set<std::string> s;
  for (auto& st : p.steps)
    if (!st.is_input) s.insert(op_table()[static_cast<std::size_t>(st.op.desc)].name);
  return s;
}

std::string join(const std::set<std::string>& s) {
  std::string o;
  for (auto& x : s) o += (o.empty() ? "" : " ") + x;
  return o;
}

std::string title_of(const Program& p) {
  return "fuzz: seed " + std::to_string(p.seed) + " graph " + std::to_string(p.index);
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);

  if (o.print >= 0) {
    Program p = generate(o.seed, static_cast<std::uint64_t>(o.print), o.lim);
    std::cout << test_case_cxx(p, title_of(p),
                               "kiln_fuzz --seed " + std::to_string(o.seed) + " --print " + std::to_string(o.print) +
                                   generation_flags(o));
    return 0;
  }
  if (o.one >= 0) {
    Program p = generate(o.seed, static_cast<std::uint64_t>(o.one), o.lim);
    std::cout << test_case_cxx(p, title_of(p), "graph " + std::to_string(o.one));
    print_stack_on_crash();
    Verdict v = safe_check(p, device_of(o.device), o.selftest);
    std::cout << "verdict: " << kind_name(v.kind) << (v.detail.empty() ? "" : ": " + v.detail) << "\n";
    if (v.excused) std::cout << "excused elements: " << v.excused << "\n";
    return is_bug(v.kind) ? 1 : 0;
  }

  std::printf("kiln fuzz: seed %llu, graphs %llu..%llu, device %s, up to %d ops, %d job(s)\n",
              static_cast<unsigned long long>(o.seed), static_cast<unsigned long long>(o.first),
              static_cast<unsigned long long>(o.first + o.graphs - 1), o.device.c_str(), o.lim.max_ops, o.jobs);
  double t0 = now_s();
  std::vector<Record> records = o.fork ? run_campaign(o) : run_in_process(o);
  double campaign_s = now_s() - t0;

  // ---- summary
  std::map<std::string, int> by_kind;
  std::map<std::string, std::pair<int, int>> by_op;  // graphs containing it, findings containing it
  long compiles = 0;
  std::size_t excused_graphs = 0, excused_elements = 0;
  std::vector<const Record*> findings;
  for (const Record& r : records) {
    by_kind[kind_name(r.verdict.kind)]++;
    compiles += r.compiles;
    excused_graphs += r.verdict.excused ? 1 : 0;
    excused_elements += r.verdict.excused;
    Program p = generate(o.seed, r.index, o.lim);
    for (auto& n : op_names(p)) {
      by_op[n].first++;
      if (is_bug(r.verdict.kind)) by_op[n].second++;
    }
    if (is_bug(r.verdict.kind)) findings.push_back(&r);
  }
  std::printf("\n==== kiln fuzz summary: seed %llu, %zu graphs in %.1f s (%.2f s/graph, %ld kernel compiles)\n",
              static_cast<unsigned long long>(o.seed), records.size(), campaign_s,
              records.empty() ? 0.0 : campaign_s / static_cast<double>(records.size()), compiles);
  std::printf("outcomes:");
  for (auto& [k, n] : by_kind) std::printf(" %s %d,", k.c_str(), n);
  std::printf("\nfindings: %zu\n", findings.size());
  std::printf(
      "excused: %zu elements in %zu graphs outside the dtype tolerance of the reference, ill-conditioned by the\n"
      "  nudged float64 twin or no further from the twin than %.0fx the reference (docs/fuzzing.md)\n",
      excused_elements, excused_graphs, kTwinFactor);
  if (o.selftest)
    std::printf("self-test: every JIT result was corrupted in one element; caught in %d of %zu graphs\n",
                by_kind["mismatch"], records.size());
  std::map<std::string, std::pair<int, std::string>> probe_kinds;
  for (const Record& r : g_probe_failures) {
    std::string name = r.verdict.detail.substr(0, r.verdict.detail.find(':'));
    if (!probe_kinds[name].first++) probe_kinds[name].second = r.verdict.detail.substr(0, 400);
  }
  std::printf("error probes: %zu run, %zu failed (%zu of %zu kinds)\n", g_probes, g_probe_failures.size(),
              probe_kinds.size(), probe_table().size());
  for (auto& [name, c] : probe_kinds) std::printf("  %dx %s\n", c.first, c.second.c_str());
  std::printf("by op (graphs containing it / findings among them):\n");
  int col = 0;
  for (auto& [n, c] : by_op) {
    std::printf("  %-18s %5d /%4d", n.c_str(), c.first, c.second);
    if (++col % 3 == 0) std::printf("\n");
  }
  std::printf("\n");

  // ---- shrinking: one representative per signature first, then more of the same signature
  // while the budget lasts; distinct shrunk programs are the distinct bugs.
  if (!o.out.empty()) ::mkdir(o.out.c_str(), 0755);
  std::map<std::string, std::vector<const Record*>> by_sig;
  std::vector<std::string> sig_order;
  for (const Record* r : findings) {
    std::string s = r->verdict.signature();
    if (!by_sig.count(s)) sig_order.push_back(s);
    by_sig[s].push_back(r);
  }
  std::vector<const Record*> to_shrink;
  for (std::size_t round = 0; to_shrink.size() < static_cast<std::size_t>(o.shrink_max) && round < 3; ++round)
    for (auto& s : sig_order)
      if (round < by_sig[s].size() && to_shrink.size() < static_cast<std::size_t>(o.shrink_max))
        to_shrink.push_back(by_sig[s][round]);
  Device dev = device_of(o.device);
  std::map<std::string, std::string> distinct;  // signature + shrunk ops -> report
  int file_no = 0;
  for (const Record* r : to_shrink) {
    Program p = generate(o.seed, r->index, o.lim);
    std::string want = r->verdict.signature();
    auto judge_one = [&](const Program& c) {
      return o.fork ? in_child([&] { return safe_check(c, dev); }, o.graph_timeout) : safe_check(c, dev);
    };
    Verdict last = r->verdict;
    Shrinker sh(
        [&](const Program& c) {
          Verdict v = judge_one(c);
          if (v.signature() != want) return false;
          last = v;
          return true;
        },
        ShrinkBudget{o.shrink_seconds, 400});
    ShrinkStats st;
    Program small = sh.run(p, &st);
    std::string key = want + " | " + join(op_names(small));
    std::string comment = "kiln_fuzz --seed " + std::to_string(o.seed) + " --one " + std::to_string(r->index) +
                          generation_flags(o) + " (shrunk from " + std::to_string(st.ops_before) + " ops to " +
                          std::to_string(st.ops_after) + ", " + std::to_string(st.runs) + " runs)\n" +
                          kind_name(last.kind) + ": " + headline(last.detail);
    std::string cxx = test_case_cxx(small, title_of(small), comment);
    std::string path;
    if (!o.out.empty()) {
      char name[256];
      std::snprintf(name, sizeof name, "%s/%02d-%s-s%llu-g%llu.cpp", o.out.c_str(), ++file_no, kind_name(last.kind),
                    static_cast<unsigned long long>(o.seed), static_cast<unsigned long long>(r->index));
      std::ofstream(name) << cxx;
      path = name;
    }
    std::printf("\n---- %s (graph %llu, %d -> %d ops)%s%s\n%s", want.c_str(), static_cast<unsigned long long>(r->index),
                st.ops_before, st.ops_after, path.empty() ? "" : ": ", path.c_str(), cxx.c_str());
    if (!distinct.count(key)) distinct[key] = path.empty() ? "graph " + std::to_string(r->index) : path;
  }
  if (!to_shrink.empty()) {
    std::printf("\ndistinct shrunk findings: %zu\n", distinct.size());
    for (auto& [k, v] : distinct) std::printf("  %s  -> %s\n", k.c_str(), v.c_str());
  }
  if (!o.out.empty()) {
    std::ofstream sum(o.out + "/summary.txt");
    sum << "seed " << o.seed << " graphs " << records.size() << " findings " << findings.size() << " seconds "
        << campaign_s << "\n";
    for (const Record& r : records)
      sum << r.index << "\t" << kind_name(r.verdict.kind) << "\t" << r.compiles << "\t" << r.seconds << "\t"
          << r.verdict.excused << "\t" << escape(r.verdict.detail, 300) << "\n";
  }
  return (o.fail_on_find && (!findings.empty() || !g_probe_failures.empty())) ? 1 : 0;
}
