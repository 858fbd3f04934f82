// A character-level GPT (examples/gpt.hpp) trained end to end with kiln::nn: token and
// position embeddings, causal self-attention blocks, a tied head, cross_entropy, AdamW with a
// linear warm-up and cosine decay, gradient clipping; the model runs compiled. The text is
// generated here (a small grammar of English sentences, about 300 KB). Prints the loss curve,
// writes it as CSV, and exits non-zero if the loss did not fall.
//
//   train_gpt [--steps N] [--csv path] [--eager]     (KILN_DEVICE=cuda: on the GPU, bf16 autocast)
#include <kiln/kiln.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "gpt.hpp"

using namespace kiln;

namespace {

/// Sentences from a small grammar, drawn by a fixed-seed generator: enough structure (word
/// spellings, agreement, punctuation) for a small model's loss to fall quickly.
std::string make_corpus(std::size_t bytes) {
  const std::vector<std::string> subjects = {"the cat", "a dog", "the old man", "my sister", "the bird", "a child",
                                             "the teacher", "our neighbour", "the king", "a farmer"};
  const std::vector<std::string> verbs = {"sees", "likes", "finds", "carries", "paints", "follows", "calls", "feeds"};
  const std::vector<std::string> adjectives = {"red", "small", "quiet", "happy", "green", "tall", "cold", "bright"};
  const std::vector<std::string> objects = {"ball", "house", "river", "apple", "book", "garden", "horse", "song"};
  const std::vector<std::string> places = {"in the morning", "by the sea", "after dinner", "near the hill",
                                           "at school", "every day"};
  std::uint64_t s = 88172645463325252ull;
  auto pick = [&](std::size_t n) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return static_cast<std::size_t>(s % n);
  };
  std::string text;
  while (text.size() < bytes) {
    std::string sentence = subjects[pick(subjects.size())] + " " + verbs[pick(verbs.size())] + " the " +
                           adjectives[pick(adjectives.size())] + " " + objects[pick(objects.size())];
    if (pick(2)) sentence += " " + places[pick(places.size())];
    sentence[0] = static_cast<char>(sentence[0] - 'a' + 'A');
    text += sentence + (pick(4) ? ". " : ".\n");
  }
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 300;
  std::string csv = "train_gpt_loss.csv";
  bool compiled = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (a == "--csv" && i + 1 < argc) csv = argv[++i];
    else if (a == "--eager") compiled = false;
    else {
      std::fprintf(stderr, "usage: train_gpt [--steps N] [--csv path] [--eager]\n");
      return 2;
    }
  }
  const char* dev = std::getenv("KILN_DEVICE");
  const Device device = (dev && std::string(dev) == "cuda") ? Device::cuda() : Device::cpu();

  // Characters -> token ids.
  const std::string text = make_corpus(300000);
  std::map<char, std::int64_t> vocab;
  for (char c : text) vocab.emplace(c, 0);
  std::int64_t next = 0;
  for (auto& [c, id] : vocab) id = next++;
  std::vector<std::int64_t> tokens;
  for (char c : text) tokens.push_back(vocab[c]);

  gpt::Config config;
  config.vocab_size = next;
  config.block_size = 64;
  config.n_layer = 2;
  config.n_head = 4;
  config.n_embd = device.is_cuda() ? 256 : 64;
  const std::int64_t batch = device.is_cuda() ? 32 : 8, T = config.block_size;

  manual_seed(1337);
  gpt::Gpt model(config);
  model.to(device);
  if (compiled) model.compile();
  std::size_t n_params = 0;
  for (const Tensor& p : model.parameters()) n_params += static_cast<std::size_t>(p.numel());
  std::printf("GPT: %zu parameters, vocabulary %lld, %lld layers, d %lld, on %s%s\n", n_params,
              static_cast<long long>(config.vocab_size), static_cast<long long>(config.n_layer),
              static_cast<long long>(config.n_embd), device.str().c_str(), compiled ? ", compiled" : "");

  optim::AdamW opt(model.parameters(), {.lr = 3e-3, .betas = {0.9, 0.95}, .weight_decay = 0.1});
  const int warmup = std::max(1, steps / 10);
  optim::LambdaLR schedule(opt, [&](std::int64_t step) {
    if (step < warmup) return static_cast<double>(step + 1) / warmup;
    const double progress = static_cast<double>(step - warmup) / std::max(1, steps - warmup);
    return 0.1 + 0.9 * 0.5 * (1.0 + std::cos(3.141592653589793 * progress));
  });

  std::uint64_t s = 2463534242ull;
  auto random_offset = [&] {
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    return static_cast<std::size_t>(s % (tokens.size() - static_cast<std::size_t>(T) - 1));
  };
  std::ofstream out(csv);
  out << "step,loss,ms\n";
  std::vector<float> losses;
  for (int step = 0; step < steps; ++step) {
    std::vector<std::int64_t> xs, ys;
    for (std::int64_t b = 0; b < batch; ++b) {
      const std::size_t at = random_offset();
      xs.insert(xs.end(), tokens.begin() + at, tokens.begin() + at + T);
      ys.insert(ys.end(), tokens.begin() + at + 1, tokens.begin() + at + T + 1);
    }
    Tensor x = from_vector(xs, {batch, T}, device), y = from_vector(ys, {batch, T}, device);
    const auto t0 = std::chrono::steady_clock::now();
    Tensor loss;
    {
      AutocastGuard amp(bf16, device.is_cuda());  // bf16 products on the GPU, f32 on the CPU
      loss = gpt::Gpt::loss(model(x), y);
    }
    opt.zero_grad();
    loss.backward();
    nn::utils::clip_grad_norm_(model.parameters(), 1.0);
    opt.step();
    schedule.step();
    const float l = loss.item<float>();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    losses.push_back(l);
    out << step << "," << l << "," << ms << "\n";
    if (step % 25 == 0 || step == steps - 1) std::printf("step %4d  loss %.4f  %.1f ms\n", step, l, ms);
  }
  // The loss falls: the mean of the last tenth of the steps is well below the first step's
  // (ln(vocabulary) for an untrained model).
  const std::size_t tail = std::max<std::size_t>(1, losses.size() / 10);
  float end = 0;
  for (std::size_t i = losses.size() - tail; i < losses.size(); ++i) end += losses[i] / static_cast<float>(tail);
  std::printf("loss %.4f -> %.4f (curve in %s)\n", losses.front(), end, csv.c_str());
  return end < 0.75f * losses.front() ? 0 : 1;
}
