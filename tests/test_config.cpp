#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <glob.h>

#include "config/command_line.h"
#include "config/config.h"
#include "layout/layout.h"
#include "util/error.h"

using yuan::Config;
using yuan::Error;

namespace {

// A deck in /tmp; removed when the test ends.
class TempDeck {
 public:
  explicit TempDeck(const std::string& text)
      : path_(yuan::strf("/tmp/yuan_test_config_%d_%d.ini", static_cast<int>(getpid()), counter_++)) {
    std::ofstream(path_) << text;
  }
  ~TempDeck() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

Config parse(const std::vector<std::string>& args) {
  Config c;
  EXPECT_TRUE(yuan::parse_config(args, "train", c));
  return c;
}

// The message of the Error that `f` throws (and that it is collective), or "" if it does not throw.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_TRUE(e.collective()) << e.what();
    return e.what();
  }
  return "";
}

std::string parse_error(const std::vector<std::string>& args) {
  return error_of([&] { parse({args}); });
}

// A config that passes layout::validate() with world 2.
Config valid() {
  Config c;
  c.model = {2, 2, 8, 16, 32};
  c.data.train = "shards/*.h5";
  return c;
}

std::string validate_error(const std::function<void(Config&)>& edit, int world = 2) {
  Config c = valid();
  edit(c);
  return error_of([&] { yuan::layout::validate(c, world); });
}

const char* kDeck = R"(# a comment
[model]
n_layer = 3
n_head = 2   # trailing comment
n_embd = 16
seq_len = 32
vocab_size = 100

[data]
train = data/x/train_*.h5
val =

[optim]
lr = 3e-4

[run]
dir = runs/t
)";

}  // namespace

TEST(ConfigDefaults, MatchStructAndTable) {
  Config c = parse({});
  EXPECT_EQ(c.hash(), Config().hash());
  EXPECT_EQ(c.train.micro_batch, 4);
  EXPECT_EQ(c.optim.zero.number(), 1);
  EXPECT_EQ(c.train.device, "auto");
  EXPECT_EQ(c.optim.offload, yuan::Offload::Auto);
  EXPECT_EQ(c.model.attention, yuan::AttentionKernels::Auto);
  auto opts = yuan::config_options();
  ASSERT_FALSE(opts.empty());
  EXPECT_EQ(opts.front().key, "model.n_layer");
  for (const auto& o : opts) {
    EXPECT_FALSE(o.help.empty()) << o.key;
    if (o.key == "optim.lr") {
      EXPECT_EQ(o.default_value, "0.0006");
    }
    if (o.key == "train.seed") {
      EXPECT_EQ(o.default_value, "1337");
    }
  }
}

TEST(ConfigParse, Deck) {
  TempDeck deck(kDeck);
  Config c = parse({deck.path()});
  EXPECT_EQ(c.model.n_layer, 3);
  EXPECT_EQ(c.model.n_head, 2);
  EXPECT_EQ(c.model.vocab_size, 100);
  EXPECT_EQ(c.data.train, "data/x/train_*.h5");
  EXPECT_EQ(c.data.val, "");
  EXPECT_DOUBLE_EQ(c.optim.lr, 3e-4);
  EXPECT_EQ(c.run.dir, "runs/t");
  EXPECT_EQ(c.train.steps, Config().train.steps);  // untouched keys keep their defaults
  EXPECT_EQ(parse({"--config", deck.path()}).hash(), c.hash());
  EXPECT_EQ(parse({"--config=" + deck.path()}).hash(), c.hash());
}

TEST(ConfigParse, CommandLineWins) {
  TempDeck deck(kDeck);
  Config c = parse({deck.path(), "--model.n_layer=7", "--optim.lr", "1e-3", "--train.device=cpu"});
  EXPECT_EQ(c.model.n_layer, 7);
  EXPECT_DOUBLE_EQ(c.optim.lr, 1e-3);
  EXPECT_EQ(c.train.device, "cpu");
  EXPECT_EQ(c.model.n_head, 2);
  // Overrides before the deck still win, and the last repeat wins.
  c = parse({"--train.steps=5", deck.path(), "--train.steps=6"});
  EXPECT_EQ(c.train.steps, 6);
}

TEST(ConfigParse, Help) {
  Config c;
  c.train.steps = 99;
  testing::internal::CaptureStdout();
  EXPECT_FALSE(yuan::parse_config({"--help"}, "train", c));
  std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("usage: yuanlm train [DECK]"), std::string::npos);
  EXPECT_NE(out.find("[optim]"), std::string::npos);
  EXPECT_NE(out.find("--optim.lr (0.0006)"), std::string::npos);
  EXPECT_EQ(c.train.steps, 99);
}

TEST(ConfigParse, EveryDeckInInputValidates) {
  glob_t g;
  ASSERT_EQ(glob("input/*.ini", 0, nullptr, &g), 0) << "run the tests from the repository root";
  std::vector<std::string> decks(g.gl_pathv, g.gl_pathv + g.gl_pathc);
  globfree(&g);
  EXPECT_GE(decks.size(), 5u);
  for (const std::string& d : decks) {
    SCOPED_TRACE(d);
    Config c = parse({d});
    EXPECT_GT(c.model.n_layer, 0);
    EXPECT_NO_THROW(yuan::layout::validate(c, 1));
    EXPECT_NO_THROW(yuan::layout::validate(c, 2));
  }
}

TEST(ConfigErrors, UnknownKeyDidYouMean) {
  TempDeck deck("[model]\nn_layr = 3\n");
  EXPECT_EQ(parse_error({deck.path()}),
            deck.path() + ": unknown key 'model.n_layr' (did you mean 'model.n_layer'?)");
  EXPECT_EQ(parse_error({"--model.n_embed=3"}), "unknown option '--model.n_embed' (did you mean '--model.n_embd'?)");
  EXPECT_EQ(parse_error({"--bogus=3"}), "unknown option '--bogus'");
  EXPECT_EQ(yuan::closest_key("train.lr"), "optim.lr");  // right key, wrong section
  EXPECT_EQ(yuan::closest_key("n_layer"), "model.n_layer");  // no section
  EXPECT_EQ(yuan::closest_key("model.xyz"), "");
  TempDeck bad_section("[modle]\nn_layer = 3\n");
  EXPECT_NE(parse_error({bad_section.path()}).find("(did you mean 'model.n_layer'?)"), std::string::npos);
}

TEST(ConfigErrors, BadTypeNamesKey) {
  EXPECT_EQ(parse_error({"--model.n_layer=abc"}), "model.n_layer: 'abc' is not an integer");
  EXPECT_EQ(parse_error({"--model.n_layer=3.5"}), "model.n_layer: '3.5' is not an integer");
  EXPECT_EQ(parse_error({"--model.vocab_size=3000000000"}), "model.vocab_size: '3000000000' is not an integer");
  EXPECT_EQ(parse_error({"--train.seed=-1"}), "train.seed: '-1' is not a non-negative integer");
  EXPECT_EQ(parse_error({"--optim.lr=fast"}), "optim.lr: 'fast' is not a finite number");
  EXPECT_EQ(parse_error({"--train.recompute=maybe"}), "train.recompute: 'maybe' is not true or false");
  EXPECT_EQ(parse_error({"--optim.zero=two"}), "optim.zero: 'two' is not an integer");
  TempDeck deck("[optim]\nlr = 1e-3x\n");
  EXPECT_EQ(parse_error({deck.path()}), deck.path() + ": optim.lr: '1e-3x' is not a finite number");
  TempDeck stage("[optim]\nzero = 2.5\n");
  EXPECT_EQ(parse_error({stage.path()}), stage.path() + ": optim.zero: '2.5' is not an integer");
  // A key that takes one of a few names lists them, in order.
  EXPECT_EQ(parse_error({"--optim.offload=gpu"}), "optim.offload must be auto, host or none (got 'gpu')");
  EXPECT_EQ(parse_error({"--model.attention=x"}), "model.attention must be auto, cudnn or own (got 'x')");
  TempDeck placement("[optim]\noffload = Host\n");
  EXPECT_EQ(parse_error({placement.path()}),
            placement.path() + ": optim.offload must be auto, host or none (got 'Host')");
}

TEST(ConfigErrors, DeckProblems) {
  EXPECT_EQ(parse_error({"/nonexistent/x.ini"}), "cannot read config deck '/nonexistent/x.ini'");
  TempDeck twice("[train]\nsteps = 3\nsteps = 4\n");
  EXPECT_EQ(parse_error({twice.path()}), twice.path() + ": key 'train.steps' is set twice");
  TempDeck a("[train]\nsteps = 3\n"), b("[train]\nsteps = 4\n");
  EXPECT_NE(parse_error({a.path(), "--config", b.path()}).find("two config decks"), std::string::npos);
  EXPECT_NE(parse_error({"--model.n_layer"}), "");  // missing value
  // An ifstream reads a directory as an empty deck: the run would go on with the defaults.
  EXPECT_EQ(parse_error({"/tmp"}), "deck /tmp is a directory, expected an INI file");
  // A deck defines each template once; the command line may replace one of the deck's.
  TempDeck templates("[parallel]\ntemplate = t: auto:1\ntemplate = u: auto:1\ntemplate = t: auto:2\n");
  EXPECT_EQ(parse_error({templates.path()}), templates.path() + ": parallel.template 't' is defined twice");
  TempDeck one("[parallel]\ntemplate = t: auto:1\ntemplate = u: auto:1\n");
  EXPECT_EQ(parse({one.path(), "--parallel.template=t: auto:2"}).parallel.templates,
            (std::vector<std::string>{"t: auto:2", "u: auto:1"}));
}

TEST(ConfigParse, EmptyValueOnTheCommandLine) {
  // --data.val= turns evaluation off, as the help says; the deck's value is replaced by the empty one.
  TempDeck deck("[data]\nval = data/x/val_*.h5\n");
  EXPECT_EQ(parse({deck.path(), "--data.val="}).data.val, "");
  EXPECT_EQ(parse({deck.path(), "--data.val", ""}).data.val, "");
  EXPECT_EQ(parse({"--profile.steps="}).profile.steps, "");
  // Where empty means nothing, the key's own conversion or check names it.
  EXPECT_EQ(parse_error({"--model.n_layer="}), "model.n_layer: '' is not an integer");
  EXPECT_EQ(parse_error({"--optim.lr="}), "optim.lr: '' is not a finite number");
  EXPECT_EQ(parse_error({"--train.recompute="}), "train.recompute: '' is not true or false");
  EXPECT_EQ(parse_error({"--parallel.template="}), "parallel.template: '' does not start with a name and ':'");
  Config c = valid();
  c.run.dir = parse({"--run.dir="}).run.dir;
  EXPECT_EQ(error_of([&] { yuan::layout::validate(c, 2); }), "run.dir must not be empty");
  EXPECT_EQ(yuan::split_empty_values({"--a=", "--b=1", "-c=", "x=", "--d", "--="}),
            (std::vector<std::string>{"--a", "", "--b=1", "-c=", "x=", "--d", "--="}));
}

TEST(CommandOptions, NumbersAreCheckedWhateverTheCommand) {
  namespace po = boost::program_options;
  double x = 0, t = 0;
  uint64_t seed = 0;
  int n = 0;
  po::options_description d;
  d.add_options()("help", "")("x", po::value(&x))("seed", po::value(&seed))(
      "t", po::value(&t)->notifier(yuan::at_least("cmd", "--t", 0.0)))(
      "n", po::value(&n)->notifier(yuan::at_least("cmd", "--n", 1)));
  auto err = [&](std::vector<std::string> args) { return error_of([&] { yuan::parse_command("cmd", args, d); }); };
  EXPECT_EQ(err({"--x=nan"}), "cmd: --x must be a finite number (got 'nan')");
  EXPECT_EQ(err({"--x", "-inf"}), "cmd: --x must be a finite number (got '-inf')");
  EXPECT_EQ(err({"--seed=-1"}), "cmd: --seed must be a non-negative integer (got '-1')");
  EXPECT_EQ(err({"--t=nan"}), "cmd: --t must be a finite number >= 0 (got nan)");
  EXPECT_EQ(err({"--t=-0.5"}), "cmd: --t must be a finite number >= 0 (got -0.5)");
  EXPECT_EQ(err({"--n=0"}), "cmd: --n must be >= 1 (got 0)");
  EXPECT_EQ(err({"--x=-2.5", "--seed=18446744073709551615", "--t=0", "--n=1"}), "");
  EXPECT_EQ(x, -2.5);
  EXPECT_EQ(seed, 18446744073709551615ull);
}

// Each stage shards what the one below does and one thing more; outside 0-3 a stage is what a deck said, for
// validate_optim_run to refuse.
TEST(ZeroStage, EachStageShardsOneThingMore) {
  const bool shards[4][3] = {{false, false, false}, {true, false, false}, {true, true, false}, {true, true, true}};
  for (int n = 0; n <= yuan::ZeroStage::kHighest; n++) {
    const yuan::ZeroStage stage(n);
    SCOPED_TRACE(n);
    EXPECT_TRUE(stage.valid());
    EXPECT_EQ(stage.number(), n);
    EXPECT_EQ(stage.shards_optimizer_state(), shards[n][0]);
    EXPECT_EQ(stage.shards_gradients(), shards[n][1]);
    EXPECT_EQ(stage.shards_weights(), shards[n][2]);
  }
  EXPECT_FALSE(yuan::ZeroStage(-1).valid());
  EXPECT_FALSE(yuan::ZeroStage(4).valid());
  EXPECT_EQ(parse({"--optim.zero=7"}).optim.zero.number(), 7);
}

TEST(ConfigValidate, Ranges) {
  EXPECT_NO_THROW(yuan::layout::validate(valid(), 2));
  EXPECT_EQ(validate_error([](Config& c) { c.model.n_layer = 0; }), "model.n_layer must be >= 1 (got 0)");
  EXPECT_EQ(validate_error([](Config& c) { c.model.vocab_size = 1; }), "model.vocab_size must be >= 2 (got 1)");
  EXPECT_EQ(validate_error([](Config& c) { c.optim.lr = 0; }), "optim.lr must be > 0 (got 0)");
  EXPECT_EQ(validate_error([](Config& c) { c.optim.min_lr = 1; }), "optim.min_lr (1) must be <= optim.lr (0.0006)");
  EXPECT_EQ(validate_error([](Config& c) { c.optim.beta2 = 1; }), "optim.beta2 must be in [0, 1) (got 1)");
  EXPECT_EQ(validate_error([](Config& c) { c.optim.zero = yuan::ZeroStage(4); }),
            "optim.zero must be 0, 1, 2 or 3 (got 4)");
  EXPECT_EQ(validate_error([](Config& c) { c.train.device = "gpu"; }),
            "train.device must be cpu, cuda or auto (got 'gpu')");
  for (const char* bad : {"5", "0:3", "7:6", "3:4x"}) {
    EXPECT_EQ(validate_error([&](Config& c) { c.profile.steps = bad; }),
              std::string("profile.steps must be A:B with 1 <= A <= B (got '") + bad + "')");
    EXPECT_EQ(validate_error([&](Config& c) { c.profile.kernels = bad, c.train.device = "cuda"; }),
              std::string("profile.kernels must be A:B with 1 <= A <= B (got '") + bad + "')");
  }
  Config window = valid();
  window.profile.steps = "3:5";
  EXPECT_NO_THROW(yuan::layout::validate(window, 2));
  EXPECT_EQ(window.profile.window(), std::make_pair(3, 5));
  // The kernel account times CUDA events: the device must be cuda, named (auto may resolve to the CPU).
  window.profile.kernels = "2:4";
  window.train.device = "cuda";
  EXPECT_NO_THROW(yuan::layout::validate(window, 2));
  EXPECT_EQ(window.profile.kernel_window(), std::make_pair(2, 4));
  EXPECT_EQ(Config().profile.kernel_window(), std::make_pair(0, -1));
  for (const char* device : {"cpu", "auto"})
    EXPECT_EQ(validate_error([&](Config& c) { c.profile.kernels = "1:1", c.train.device = device; }),
              std::string("profile.kernels times GPU work with CUDA events: it needs train.device=cuda (got '") +
                  device + "')");
  struct Case {
    const char* key;
    std::function<void(Config&)> edit;
  };
  for (const Case& k : std::vector<Case>{
           {"model.n_head", [](Config& c) { c.model.n_head = 0; }},
           {"model.n_embd", [](Config& c) { c.model.n_embd = -1; }},
           {"model.seq_len", [](Config& c) { c.model.seq_len = 0; }},
           {"data.train", [](Config& c) { c.data.train = ""; }},
           {"data.prefetch", [](Config& c) { c.data.prefetch = 0; }},
           {"train.micro_batch", [](Config& c) { c.train.micro_batch = 0; }},
           {"train.global_batch", [](Config& c) { c.train.global_batch = 0; }},
           {"train.steps", [](Config& c) { c.train.steps = 0; }},
           {"train.log_every", [](Config& c) { c.train.log_every = 0; }},
           {"train.eval_every", [](Config& c) { c.train.eval_every = -1; }},
           {"train.eval_batches", [](Config& c) { c.train.eval_batches = 0; }},
           {"optim.min_lr", [](Config& c) { c.optim.min_lr = -1e-5; }},
           {"optim.warmup_steps", [](Config& c) { c.optim.warmup_steps = -1; }},
           {"optim.weight_decay", [](Config& c) { c.optim.weight_decay = -0.1; }},
           {"optim.beta1", [](Config& c) { c.optim.beta1 = -0.1; }},
           {"optim.eps", [](Config& c) { c.optim.eps = 0; }},
           {"optim.grad_clip", [](Config& c) { c.optim.grad_clip = -1; }},
           {"optim.bucket_mb", [](Config& c) { c.optim.bucket_mb = 0; }},
           {"run.dir", [](Config& c) { c.run.dir = ""; }},
       }) {
    std::string msg = validate_error(k.edit);
    EXPECT_EQ(msg.rfind(k.key, 0), 0u) << k.key << ": " << msg;
  }
}

TEST(ConfigValidate, DeadlinesThatWouldOverflowAreRefused) {
  // In nanoseconds, 1e12 s is past int64: the deadline would land in the past and end the job at once.
  for (double s : {1e12, 1e300, 30 * 86400 + 1.0})
    for (const char* key : {"dist.timeout_s", "dist.nccl_timeout_s"}) {
      const std::string msg = validate_error([&](Config& c) {
        (std::string(key) == "dist.timeout_s" ? c.dist.timeout_s : c.dist.nccl_timeout_s) = s;
      });
      EXPECT_EQ(msg.rfind(std::string(key) + " must be <= 2592000 s (30 days", 0), 0u) << msg;
    }
  EXPECT_EQ(validate_error([](Config& c) { c.dist.timeout_s = 30 * 86400; }), "");
  EXPECT_EQ(validate_error([](Config& c) { c.profile.steps = "3:5", c.train.steps = 4; }),
            "profile.steps 3:5 ends after train.steps (4): the profile would never be closed");
  EXPECT_EQ(validate_error([](Config& c) { c.profile.kernels = "3:5", c.train.steps = 4, c.train.device = "cuda"; }),
            "profile.kernels 3:5 ends after train.steps (4): the account would never be written");
}

TEST(ConfigValidate, KeysThatUndoEachOtherAreSaidOnce) {
  auto warnings = [](const std::function<void(Config&)>& edit) {
    Config c = valid();
    edit(c);
    ::testing::internal::CaptureStderr();
    yuan::layout::validate(c, 2);
    return ::testing::internal::GetCapturedStderr();
  };
  EXPECT_EQ(warnings([](Config& c) { c.train.steps = 6, c.optim.warmup_steps = 6; }), "");
  EXPECT_NE(warnings([](Config& c) { c.train.steps = 6, c.optim.warmup_steps = 1000; })
                .find("optim.warmup_steps (1000) > train.steps (6): the learning rate never reaches optim.lr (0.0006); "
                      "the last step's is 3.6e-06"),
            std::string::npos);
  EXPECT_NE(warnings([](Config& c) { c.train.steps = 6, c.ckpt.local_every = 6; })
                .find("ckpt.local_every (6) >= train.steps (6): no node-memory checkpoint is ever written"),
            std::string::npos);
}

TEST(ConfigValidate, DivisibilityNamesBothKeys) {
  EXPECT_EQ(validate_error([](Config& c) { c.model.n_embd = 768, c.model.n_head = 10; }),
            "model.n_embd (768) must be divisible by model.n_head (10)");
  EXPECT_EQ(validate_error([](Config& c) { c.train.global_batch = 10, c.train.micro_batch = 2; }, 4),
            "train.global_batch (10) must be divisible by world size (4) x train.micro_batch (2) = 8");
}

TEST(ConfigIni, RoundTrips) {
  Config c = valid();
  c.optim.lr = 0.1 + 0.2;  // not exactly representable in few digits
  c.optim.eps = 1e-300;
  c.train.seed = 18446744073709551615ull;
  c.data.val = "";
  c.run.dir = "runs/with space";
  c.optim.zero = yuan::ZeroStage(3);
  c.optim.offload = yuan::Offload::None;
  c.model.attention = yuan::AttentionKernels::Own;
  TempDeck deck(c.to_ini());
  Config back = parse({deck.path()});
  EXPECT_EQ(back.to_ini(), c.to_ini());
  EXPECT_EQ(back.hash(), c.hash());
  EXPECT_EQ(back.optim.lr, c.optim.lr);
  EXPECT_EQ(back.optim.zero.number(), 3);
  EXPECT_NE(c.to_ini().find("\nzero = 3\n"), std::string::npos);
  EXPECT_EQ(back.optim.offload, yuan::Offload::None);
  EXPECT_NE(c.to_ini().find("\noffload = none\n"), std::string::npos);
  EXPECT_EQ(back.model.attention, yuan::AttentionKernels::Own);
  EXPECT_NE(c.to_ini().find("\nattention = own\n"), std::string::npos);
  EXPECT_NE(c.to_ini().find("[optim]\n"), std::string::npos);
}

TEST(ConfigIni, HashChangesWithAnyValue) {
  // Change each key through the command line, so the test follows the table as it grows.
  const uint64_t base = Config().hash();
  for (const auto& o : yuan::config_options()) {
    std::string v = o.default_value == "1" ? "2" : "1";
    if (o.key == "train.device") v = "cpu";
    if (o.key == "model.attention") v = "own";
    if (o.key == "optim.offload") v = "host";
    if (o.key == "parallel.template") v = "t: auto:1";
    Config c = parse({"--" + o.key + "=" + v});
    EXPECT_NE(c.hash(), base) << o.key;
  }
}

TEST(ConfigIni, DifferenceNamesTheFirstKeyAndBothValues) {
  Config a = valid(), b = valid();
  EXPECT_EQ(yuan::ini_difference(a.to_ini(), "rank 0@n0", b.to_ini(), "rank 3@n1"), "");
  b.optim.lr = 0.01;
  b.run.dir = "elsewhere";
  EXPECT_EQ(yuan::ini_difference(a.to_ini(), "rank 0@n0", b.to_ini(), "rank 3@n1"),
            "optim.lr = '0.01' on rank 3@n1, '0.0006' on rank 0@n0");
  b = valid();
  b.parallel.templates = {"t: auto:1", "u: auto:2"};
  a.parallel.templates = {"t: auto:1"};
  EXPECT_EQ(yuan::ini_difference(a.to_ini(), "A", b.to_ini(), "B"),
            "parallel.template = 't: auto:1'; 'u: auto:2' on B, 't: auto:1' on A");
  a.parallel.templates = {};
  EXPECT_EQ(yuan::ini_difference(a.to_ini(), "A", b.to_ini(), "B"),
            "parallel.template = 't: auto:1'; 'u: auto:2' on B, (not set) on A");
}

// The README's configuration reference is a copy of `yuanlm train --help`: every key must be in it.
TEST(ConfigDocs, ReadmeListsEveryKey) {
  std::ifstream in("README.md");
  ASSERT_TRUE(in) << "run the tests from the repository root";
  std::stringstream readme;
  readme << in.rdbuf();
  for (const yuan::ConfigOption& o : yuan::config_options())
    EXPECT_NE(readme.str().find("--" + o.key + " (" + o.default_value + ")"), std::string::npos)
        << o.key << " (default " << o.default_value << ") is missing from README.md's configuration reference";
}
