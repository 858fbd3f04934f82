// Collectives, process groups, the rendezvous and DistributedDataParallel, on the CPU: ranks run
// as threads (distributed::run_threads), whose transport checks that every rank calls the same
// collectives. The same code runs over NCCL between GPUs (only a machine with several GPUs can
// test that; docs/distributed.md says what ran where).
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gpt.hpp"
#include "kiln/kiln.hpp"
#include "kiln/runtime/nccl.hpp"

namespace kiln_test_distributed_distributed {

using namespace kiln;
namespace dist = kiln::distributed;

namespace {

Tensor vec(const std::vector<float>& v) { return from_vector(v, Shape{static_cast<std::int64_t>(v.size())}); }

/// Rank r's input: element i is (r + 1) * (i + 1) / 4, so ranks differ and sums are exact.
std::vector<float> rank_values(int r, int n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<float>((r + 1) * (i + 1)) / 4.0f;
  return v;
}

/// Records every collective a group issues (kind and element count), then passes it on.
class RecordingTransport final : public dist::Transport {
 public:
  explicit RecordingTransport(dist::Transport& inner) : inner_(inner) {}
  std::string name() const override { return inner_.name(); }
  bool supports(Device d) const override { return inner_.supports(d); }
  Device device() const override { return inner_.device(); }
  void all_reduce(void* data, std::int64_t n, DType t, dist::ReduceOp op, Device d) override {
    log.push_back("all_reduce " + std::to_string(n));
    if (on_all_reduce) on_all_reduce();
    inner_.all_reduce(data, n, t, op, d);
  }
  std::shared_ptr<dist::Work> all_reduce_async(void* data, std::int64_t n, DType t, dist::ReduceOp op,
                                               Device d) override {
    log.push_back("all_reduce " + std::to_string(n) + " async");
    if (on_all_reduce) on_all_reduce();
    return inner_.all_reduce_async(data, n, t, op, d);
  }
  void all_gather(const void* in, void* out, std::int64_t n, DType t, Device d) override {
    log.push_back("all_gather " + std::to_string(n));
    inner_.all_gather(in, out, n, t, d);
  }
  void reduce_scatter(const void* in, void* out, std::int64_t n, DType t, dist::ReduceOp op, Device d) override {
    log.push_back("reduce_scatter " + std::to_string(n));
    inner_.reduce_scatter(in, out, n, t, op, d);
  }
  void broadcast(void* data, std::int64_t n, DType t, int root, Device d) override {
    log.push_back("broadcast " + std::to_string(n));
    inner_.broadcast(data, n, t, root, d);
  }
  void barrier() override { inner_.barrier(); }
  std::vector<std::string> log;
  std::function<void()> on_all_reduce;  ///< called as each all_reduce is issued

 private:
  dist::Transport& inner_;
};

std::shared_ptr<nn::Sequential> small_mlp(std::uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<nn::Sequential>(nn::Linear(4, 8), nn::ReLU(), nn::Linear(8, 3));
}

Tensor mse(const Tensor& y, const Tensor& target) { return mean((y - target) * (y - target)); }

/// A TCP port nothing listens on now (the kernel's pick for port 0).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace

TEST_CASE("collectives over thread ranks give every rank the reduction written out") {
  constexpr int W = 3, N = 5;
  std::mutex m;
  std::vector<std::string> failures;
  auto expect = [&](bool ok, const std::string& what) {
    if (ok) return;
    std::lock_guard lock(m);
    failures.push_back(what);
  };
  dist::run_threads(W, [&](int r) {
    CHECK(dist::get_rank() == r);
    CHECK(dist::get_world_size() == W);
    CHECK(dist::default_group().backend() == "threads");
    CHECK(dist::default_group().device() == Device::cpu());
    const struct {
      dist::ReduceOp op;
      float (*fold)(float, float);
    } cases[] = {{dist::ReduceOp::Sum, [](float a, float b) { return a + b; }},
                 {dist::ReduceOp::Max, [](float a, float b) { return std::max(a, b); }},
                 {dist::ReduceOp::Min, [](float a, float b) { return std::min(a, b); }},
                 {dist::ReduceOp::Product, [](float a, float b) { return a * b; }}};
    for (const auto& c : cases) {
      Tensor t = vec(rank_values(r, N));
      dist::all_reduce(t, c.op);
      const std::vector<float> got = t.to_vector<float>();
      for (int i = 0; i < N; ++i) {
        float want = rank_values(0, N)[i];
        for (int q = 1; q < W; ++q) want = c.fold(want, rank_values(q, N)[i]);
        expect(got[i] == want, std::string("all_reduce ") + dist::reduce_op_name(c.op));
      }
    }
    // Avg (float16 too: reduced in float, rounded once), int64 sums.
    Tensor avg = vec(rank_values(r, N)).to(f16);
    dist::all_reduce(avg, dist::ReduceOp::Avg);
    const std::vector<float> a = avg.to_vector<float>();
    for (int i = 0; i < N; ++i) expect(a[i] == static_cast<float>(2 * (i + 1)) / 4.0f, "all_reduce avg f16");
    Tensor ints = full(Shape{2, 2}, r + 1, i64);
    dist::all_reduce(ints);
    for (std::int64_t v : ints.to_vector<std::int64_t>()) expect(v == 6, "all_reduce sum i64");
    // A lazy input is evaluated first; a lazy tensor read later sees the reduced value.
    Tensor lazy = vec(rank_values(r, N)) * 2.0f;
    Tensor later = lazy + 0.0f;
    dist::all_reduce(lazy);
    expect(later.to_vector<float>()[0] == 2.0f * (0.25f + 0.5f + 0.75f), "lazy reader after all_reduce");

    Tensor b = vec(rank_values(r, N));
    dist::broadcast(b, 2);
    expect(b.to_vector<float>() == rank_values(2, N), "broadcast from rank 2");

    std::vector<Tensor> gathered;
    dist::all_gather(gathered, vec(rank_values(r, N)));
    expect(gathered.size() == W, "all_gather makes world_size outputs");
    for (int q = 0; q < W && q < static_cast<int>(gathered.size()); ++q)
      expect(gathered[static_cast<std::size_t>(q)].to_vector<float>() == rank_values(q, N), "all_gather");
    Tensor into = empty(Shape{W * N});
    dist::all_gather_into_tensor(into, vec(rank_values(r, N)));
    const std::vector<float> all = into.to_vector<float>();
    for (int q = 0; q < W; ++q)
      expect(std::vector<float>(all.begin() + q * N, all.begin() + (q + 1) * N) == rank_values(q, N),
             "all_gather_into_tensor");

    // reduce_scatter_tensor: rank r gets the sum of every rank's block r.
    Tensor out = empty(Shape{N});
    dist::reduce_scatter_tensor(out, vec(rank_values(r, W * N)));
    const std::vector<float> mine = out.to_vector<float>();
    for (int i = 0; i < N; ++i) {
      float want = 0;
      for (int q = 0; q < W; ++q) want += rank_values(q, W * N)[static_cast<std::size_t>(r * N + i)];
      expect(mine[i] == want, "reduce_scatter_tensor");
    }
    std::vector<Tensor> inputs;
    for (int q = 0; q < W; ++q) inputs.push_back(full(Shape{N}, 10.0f * q + r));
    Tensor scattered = empty(Shape{N});
    dist::reduce_scatter(scattered, inputs, dist::ReduceOp::Max);
    for (float v : scattered.to_vector<float>()) expect(v == 10 * r + (W - 1), "reduce_scatter max");
    dist::barrier();
  });
  for (const std::string& f : failures) FAIL_CHECK(f);
  CHECK(failures.empty());
}

TEST_CASE("a failing, late or mismatched rank gives every rank a DistributedError instead of a hang") {
  dist::Options quick;
  quick.timeout = std::chrono::milliseconds(400);
  std::mutex m;
  std::vector<std::string> seen(2);
  // Runs `collective` on rank r, keeping the DistributedError it throws (and rethrowing it).
  auto keep_error = [&](int r, const std::function<void()>& collective) {
    try {
      collective();
    } catch (const DistributedError& e) {
      std::lock_guard lock(m);
      seen[static_cast<std::size_t>(r)] = e.what();
      throw;
    }
  };

  SUBCASE("different collectives") {
    CHECK_THROWS_AS(dist::run_threads(
                        2,
                        [&](int r) {
                          Tensor t = vec({1, 2});
                          keep_error(r, [&] { r == 0 ? (void)dist::all_reduce(t) : dist::broadcast(t, 0); });
                        },
                        quick),
                    DistributedError);
    for (const std::string& s : seen) {
      CHECK(s.find("different collectives") != std::string::npos);
      CHECK(s.find("all_reduce #0 (2 float32 elements, sum)") != std::string::npos);
      CHECK(s.find("broadcast #0 (2 float32 elements, src 0)") != std::string::npos);
    }
  }
  SUBCASE("a rank that throws ends the others' wait at once, and its error is rethrown") {
    dist::Options patient;
    patient.timeout = std::chrono::seconds(60);
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH_AS(dist::run_threads(
                             2,
                             [&](int r) {
                               if (r == 1) throw ValueError("rank one broke");
                               try {
                                 dist::all_reduce(vec({1, 2}));
                               } catch (const DistributedError& e) {
                                 std::lock_guard lock(m);
                                 seen[0] = e.what();
                               }
                             },
                             patient),
                         "rank one broke", ValueError);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
    CHECK(seen[0].find("rank 1 failed: rank one broke") != std::string::npos);
  }
  SUBCASE("a rank that does not arrive within the timeout is named") {
    CHECK_THROWS_AS(dist::run_threads(
                        2,
                        [&](int r) {
                          if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
                          keep_error(r, [] { dist::barrier(); });
                        },
                        quick),
                    DistributedError);
    CHECK(seen[0].find("waited 400 ms in barrier #0") != std::string::npos);
    CHECK(seen[0].find("for rank(s) 1, which did not arrive") != std::string::npos);
    CHECK(seen[1].find("rank(s) 1") != std::string::npos);  // the late rank learns why, too
  }
  SUBCASE("bad arguments are typed errors raised before any rank waits") {
    dist::run_threads(
        2,
        [&](int) {
          CHECK_THROWS_WITH_AS(dist::all_reduce(full(Shape{3}, 1, i64), dist::ReduceOp::Avg),
                               doctest::Contains("ReduceOp avg needs a floating dtype, not int64[3]"), DTypeError);
          CHECK_THROWS_AS(dist::all_reduce(full(Shape{3}, 1, bool_)), DTypeError);
          Tensor wrong = empty(Shape{5});
          CHECK_THROWS_WITH_AS(dist::all_gather_into_tensor(wrong, vec({1, 2})),
                               doctest::Contains("must be float32[4] on cpu"), ShapeError);
          CHECK_THROWS_AS(dist::broadcast(vec({1}), 2), ValueError);
          CHECK_THROWS_AS(dist::all_reduce(Tensor()), ValueError);
          // Nothing above reached the transport: the ranks are still in step.
          dist::barrier();
        },
        quick);
  }
  CHECK_THROWS_WITH_AS(dist::default_group(), doctest::Contains("no process group"), DistributedError);
  CHECK_FALSE(dist::is_initialized());
}

TEST_CASE("rendezvous: rank 0's id reaches every rank over TCP and through a file") {
  const int port = free_port(), unused_port = free_port();
  for (const bool through_file : {false, true}) {
    const std::string file =
        (std::filesystem::temp_directory_path() / ("kiln_rdzv_" + std::to_string(::getpid()))).string();
    std::filesystem::remove(file);
    std::vector<std::string> got(3);
    std::vector<std::thread> ranks;
    for (int r = 0; r < 3; ++r)
      ranks.emplace_back([&, r] {
        dist::RendezvousConfig c;
        c.rank = r;
        c.world_size = 3;
        c.master_addr = "127.0.0.1";
        c.master_port = port;
        c.run_id = "run-a";
        c.timeout = std::chrono::seconds(20);
        if (through_file) c.file = file;
        got[static_cast<std::size_t>(r)] = dist::share_from_rank0(c, r == 0 ? std::string("secret\0id", 9) : "");
      });
    for (auto& t : ranks) t.join();
    for (const std::string& g : got) CHECK(g == std::string("secret\0id", 9));
    // A rank of another run neither reads this run's file nor is served by its rank 0.
    dist::RendezvousConfig stranger;
    stranger.rank = 1;
    stranger.world_size = 3;
    stranger.run_id = "run-b";
    stranger.master_addr = "127.0.0.1";
    stranger.master_port = unused_port;
    stranger.timeout = std::chrono::milliseconds(300);
    if (through_file) stranger.file = file;
    CHECK_THROWS_AS(dist::share_from_rank0(stranger, ""), DistributedError);
    std::filesystem::remove(file);
  }
  ::setenv("RANK", "1", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  ::unsetenv("MASTER_PORT");
  ::unsetenv("KILN_RENDEZVOUS_FILE");
  CHECK_THROWS_WITH_AS(dist::rendezvous_from_env(), doctest::Contains("MASTER_PORT is not set"), ValueError);
  ::setenv("RANK", "two", 1);
  CHECK_THROWS_WITH_AS(dist::rendezvous_from_env(), doctest::Contains("RANK='two'"), ValueError);
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
}

TEST_CASE("NCCL is loaded at run time: a missing library or GPU is a DistributedError, before any wait") {
  const runtime::nccl::NcclState missing = runtime::nccl::load_nccl("/nonexistent/libnccl.so.2");
  CHECK_FALSE(missing.ok());
  CHECK(missing.reason.find("/nonexistent/libnccl.so.2") != std::string::npos);
  CHECK(runtime::nccl::nccl_dtype(bf16) == runtime::nccl::ncclBfloat16);
  CHECK(runtime::nccl::nccl_dtype(f32) == runtime::nccl::ncclFloat32);
  if (runtime::cuda_device_count() == 0 || !runtime::nccl::nccl_state().ok())
    CHECK_THROWS_AS(dist::init(0, 1, dist::UniqueId{}), DistributedError);
  CHECK_THROWS_AS(dist::init(2, 2, dist::UniqueId{}), ValueError);
}

TEST_CASE("DistributedDataParallel: two ranks on half batches train as one rank on the whole batch") {
  constexpr int W = 2, B = 6, steps = 3;
  manual_seed(7);
  const Tensor x = randn(Shape{B, 4});
  const Tensor y = randn(Shape{B, 3});
  // The reference: one model, the whole batch.
  auto reference = small_mlp(1);
  optim::SGD ref_opt(reference->parameters(), {.lr = 0.1, .momentum = 0.9});
  for (int s = 0; s < steps; ++s) {
    ref_opt.zero_grad();
    mse(reference->forward(x), y).backward();
    ref_opt.step();
  }
  // Replicas made with different seeds: the DDP broadcast makes rank 1's equal to rank 0's.
  std::vector<std::shared_ptr<nn::Sequential>> replicas{small_mlp(1), small_mlp(2)};
  std::vector<std::vector<std::string>> logs(W);
  std::vector<std::vector<std::vector<std::size_t>>> buckets(W);
  std::vector<std::vector<Tensor>> trained(W);
  std::vector<std::size_t> reductions(W), in_place(W);
  std::vector<std::vector<std::vector<float>>> w1_grad_seen(W);
  dist::run_threads(W, [&](int r) {
    RecordingTransport recording(dist::default_group().transport());
    dist::ProcessGroup group(r, W, std::shared_ptr<dist::Transport>(&recording, [](dist::Transport*) {}));
    nn::DistributedDataParallel ddp(replicas[static_cast<std::size_t>(r)],
                                    {.bucket_cap_mb = 200.0 / (1024 * 1024), .process_group = &group});
    optim::SGD opt(ddp.parameters(), {.lr = 0.1, .momentum = 0.9});
    const Tensor xs = slice(x, 0, r * B / W, (r + 1) * B / W), ys = slice(y, 0, r * B / W, (r + 1) * B / W);
    recording.log.clear();
    // Overlap: what w1's gradient memory (bucket 1) holds as each reduction is issued.
    const Tensor w1 = ddp.parameters()[0];
    std::vector<std::vector<float>>& seen = w1_grad_seen[static_cast<std::size_t>(r)];
    recording.on_all_reduce = [&] { seen.push_back(w1.grad().to_vector<float>()); };
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      mse(ddp(xs), ys).backward();
      opt.step();
    }
    logs[static_cast<std::size_t>(r)] = recording.log;
    buckets[static_cast<std::size_t>(r)] = ddp.bucket_indices();
    reductions[static_cast<std::size_t>(r)] = ddp.reductions();
    in_place[static_cast<std::size_t>(r)] = ddp.reductions_in_place();
    for (const Tensor& p : ddp.parameters()) trained[static_cast<std::size_t>(r)].push_back(p.detach());
  });
  // Parameters: w1 [8, 4], b1 [8], w2 [3, 8], b2 [3]; 50 floats a bucket, filled from the last.
  CHECK(buckets[0] == std::vector<std::vector<std::size_t>>{{3, 2, 1}, {0}});
  // Every step: bucket 0 (3 + 24 + 8 elements), then bucket 1 (32), once each.
  const std::vector<std::string> step_log{"all_reduce 35 async", "all_reduce 32 async"};
  std::vector<std::string> want;
  for (int s = 0; s < steps; ++s) want.insert(want.end(), step_log.begin(), step_log.end());
  CHECK(logs[0] == want);
  CHECK(logs[1] == want);
  CHECK(reductions[0] == 2 * steps);
  // Bucket 0 (the last layers) is reduced while the backward goes on: when it was issued, w1's
  // gradient memory (bucket 1) still held the previous step's values; the backward wrote the new
  // ones before bucket 1 was issued. (Evaluated as one graph, both would see the same values.)
  for (int r = 0; r < W; ++r) {
    REQUIRE(w1_grad_seen[r].size() == 2 * steps);
    for (int s = 0; s < steps; ++s) CHECK(w1_grad_seen[r][2 * s] != w1_grad_seen[r][2 * s + 1]);
  }
  CHECK(in_place[0] == 2 * steps);  // the gradients lay in the optimizer's flat buffer
  const std::vector<Tensor> ref = reference->parameters();
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const std::vector<float> a = trained[0][i].to_vector<float>(), b = trained[1][i].to_vector<float>();
    CHECK(a == b);  // the replicas stay bitwise equal
    const std::vector<float> want_p = ref[i].to_vector<float>();
    for (std::size_t k = 0; k < a.size(); ++k) CHECK(a[k] == doctest::Approx(want_p[k]).epsilon(1e-5));
  }
}

TEST_CASE(
    "DistributedDataParallel: no_sync accumulates locally, copies when gradients are elsewhere, and "
    "refuses replicas that differ or a parameter left out") {
  manual_seed(11);
  const Tensor x = randn(Shape{4, 4});
  std::vector<std::shared_ptr<nn::Sequential>> replicas{small_mlp(3), small_mlp(3)};
  std::vector<std::vector<float>> local(2), reduced(2);
  std::vector<std::size_t> in_place(2), reductions(2);
  dist::run_threads(2, [&](int r) {
    nn::DistributedDataParallel ddp(replicas[static_cast<std::size_t>(r)]);
    const Tensor w = ddp.parameters()[0];
    const Tensor xs = x * static_cast<float>(r + 1);
    {
      auto guard = ddp.no_sync();
      mean(ddp(xs)).backward();
      mean(ddp(xs * 2.0f)).backward();
    }
    CHECK(ddp.reductions() == 0);
    local[static_cast<std::size_t>(r)] = w.grad().to_vector<float>();
    // A gradient moved out of its home (a copy in grad()) is copied into the bucket and back.
    w.node()->grad_leaf->grad = (w.grad() + 0.0f).eval().node();
    (mean(ddp(xs)) * 0.0f).backward();  // adds nothing; reduces the accumulated sum
    reduced[static_cast<std::size_t>(r)] = w.grad().to_vector<float>();
    reductions[static_cast<std::size_t>(r)] = ddp.reductions();
    in_place[static_cast<std::size_t>(r)] = ddp.reductions_in_place();
  });
  CHECK(local[0] != local[1]);
  CHECK(reduced[0] == reduced[1]);
  for (std::size_t k = 0; k < reduced[0].size(); ++k)
    CHECK(reduced[0][k] == doctest::Approx((local[0][k] + local[1][k]) / 2).epsilon(1e-6));
  CHECK(reductions[0] == 1);  // one bucket (25 MiB holds the whole model)
  CHECK(in_place[0] == 0);    // w's gradient was not in the bucket: copied

  // A rank whose model differs: both ranks get a ValueError, nobody waits on a bucket.
  std::vector<std::shared_ptr<nn::Module>> unequal{small_mlp(3),
                                                   std::make_shared<nn::Sequential>(nn::Linear(4, 8), nn::ReLU())};
  CHECK_THROWS_WITH_AS(
      dist::run_threads(2, [&](int r) { nn::DistributedDataParallel ddp(unequal[static_cast<std::size_t>(r)]); }),
      doctest::Contains("every rank must wrap the same model"), ValueError);

  // A parameter that takes no part in the loss leaves its bucket unreduced: the next forward says so.
  CHECK_THROWS_WITH_AS(dist::run_threads(1,
                                         [&](int) {
                                           nn::DistributedDataParallel ddp(small_mlp(4), {.bucket_cap_mb = 1e-4});
                                           mean(ddp.module().parameters()[0] * 1.0f).backward();
                                           ddp(x);
                                         }),
                       doctest::Contains("left buckets unreduced"), ValueError);
}

TEST_CASE("DistributedDataParallel over a compiled GPT: the ranks' mean loss is the one-rank loss, step by step") {
  const gpt::Config c = gpt::small_config(11, 8, 1, 2, 16);
  const auto [tx, ty] = gpt::counting_batch(4, 8, 11, 3);
  constexpr int steps = 4;
  manual_seed(5);
  auto reference = std::make_shared<gpt::Gpt>(c);
  reference->compile();
  optim::AdamW ref_opt(reference->parameters(), {.lr = 3e-3});
  std::vector<float> want;
  for (int s = 0; s < steps; ++s) {
    Tensor loss = gpt::Gpt::loss((*reference)(tx), ty);
    ref_opt.zero_grad();
    loss.backward();
    ref_opt.step();
    want.push_back(loss.item<float>());
  }
  manual_seed(5);
  auto first = std::make_shared<gpt::Gpt>(c);
  manual_seed(6);  // another initialisation: the DDP's broadcast replaces it with rank 0's
  auto second = std::make_shared<gpt::Gpt>(c);
  std::vector<std::shared_ptr<gpt::Gpt>> replicas{first, second};
  std::vector<std::vector<float>> losses(2);
  std::vector<std::uint64_t> traces(2);
  std::vector<std::size_t> buckets(2);
  dist::run_threads(2, [&](int r) {
    auto model = replicas[static_cast<std::size_t>(r)];
    model->compile();
    // Buckets of 4 KiB: the compiled backward is evaluated a bucket at a time, each graph
    // reading what the earlier ones kept.
    nn::DistributedDataParallel ddp(model, {.bucket_cap_mb = 4.0 / 1024});
    buckets[static_cast<std::size_t>(r)] = ddp.bucket_indices().size();
    optim::AdamW opt(ddp.parameters(), {.lr = 3e-3});
    const Tensor x = slice(tx, 0, 2 * r, 2 * r + 2), y = slice(ty, 0, 2 * r, 2 * r + 2);
    for (int s = 0; s < steps; ++s) {
      Tensor loss = gpt::Gpt::loss(ddp(x), y);
      opt.zero_grad();
      loss.backward();
      opt.step();
      losses[static_cast<std::size_t>(r)].push_back(loss.item<float>());
    }
    traces[static_cast<std::size_t>(r)] = model->compile_stats().traces;
  });
  for (int s = 0; s < steps; ++s) CHECK((losses[0][s] + losses[1][s]) / 2 == doctest::Approx(want[s]).epsilon(1e-4));
  CHECK(traces[0] == 1);  // compiled once, replayed: the reductions live outside the compiled graph
  CHECK(buckets[0] >= 5);
  CHECK(want.back() < want.front());
}

namespace {
/// Two heads and one never used; rank 1 leaves head b out.
struct TwoHeads : nn::Module {
  nn::Linear a{4, 3}, b{4, 3}, never{4, 3};
  bool use_b = true;
  TwoHeads() {
    register_module("a", a);
    register_module("b", b);
    register_module("never", never);
  }
  Tensor forward(const Tensor& x) override { return use_b ? a(x) + b(x) : a(x); }
};
}  // namespace

TEST_CASE("DistributedDataParallel with find_unused_parameters: a parameter a rank left out counts as zeros there") {
  manual_seed(21);
  const Tensor x0 = randn(Shape{5, 4}), x1 = randn(Shape{5, 4});
  auto make = [](bool use_b) {
    manual_seed(22);
    auto m = std::make_shared<TwoHeads>();
    m->use_b = use_b;
    return m;
  };
  // Each rank's own gradients, without DDP.
  auto ref0 = make(true), ref1 = make(false);
  mean((*ref0)(x0)).backward();
  mean((*ref1)(x1)).backward();
  const std::vector<float> a0 = ref0->a.weight.grad().to_vector<float>(), a1 = ref1->a.weight.grad().to_vector<float>();
  const std::vector<float> b0 = ref0->b.weight.grad().to_vector<float>();
  std::vector<std::shared_ptr<TwoHeads>> replicas{make(true), make(false)};
  for (const double cap : {25.0, 1e-5}) {  // one bucket; a bucket per parameter
    for (auto& m : replicas) m->zero_grad();
    std::vector<std::vector<float>> ga(2), gb(2);
    std::vector<bool> never_has_grad(2, true);
    dist::run_threads(2, [&](int r) {
      auto& m = replicas[static_cast<std::size_t>(r)];
      nn::DistributedDataParallel ddp(m, {.bucket_cap_mb = cap, .find_unused_parameters = true});
      for (int step = 0; step < 2; ++step) {  // the second iteration starts clean
        m->zero_grad();
        mean(ddp(r == 0 ? x0 : x1)).backward();
      }
      ga[static_cast<std::size_t>(r)] = m->a.weight.grad().to_vector<float>();
      gb[static_cast<std::size_t>(r)] = m->b.weight.grad().to_vector<float>();
      never_has_grad[static_cast<std::size_t>(r)] = m->never.weight.grad().defined();
    });
    CHECK(ga[0] == ga[1]);
    CHECK(gb[0] == gb[1]);  // rank 1 left b out, and still holds the average
    for (std::size_t k = 0; k < a0.size(); ++k) {
      CHECK(ga[0][k] == doctest::Approx((a0[k] + a1[k]) / 2).epsilon(1e-6));
      CHECK(gb[0][k] == doctest::Approx(b0[k] / 2).epsilon(1e-6));
    }
    CHECK_FALSE(never_has_grad[0]);  // no rank used it
    CHECK_FALSE(never_has_grad[1]);
  }
}

}  // namespace kiln_test_distributed_distributed
