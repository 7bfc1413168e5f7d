// fulgur::cli's config engine, torch-free: sources merged in order against a schema, every error
// class naming where it came from, and the printed config reading back to the same text.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "fulgur/cli/resolve.hpp"
#include "fulgur/cli/values.hpp"

namespace cli = fulgur::cli;

namespace {

enum class Mode { min, max };

struct Inner {
  bool enabled = true;
  int code = 75;
  static constexpr auto fields() {
    return std::tuple(cli::field("enabled", &Inner::enabled, "on"), cli::field("code", &Inner::code, "exit code"));
  }
};

struct Settings {
  std::optional<std::int64_t> max_epochs{};
  std::int64_t max_steps = -1;
  double lr = 1e-3;
  std::string name = "run";
  Mode mode = Mode::min;
  std::optional<std::chrono::duration<double>> max_time{};
  std::variant<int, std::string> devices = 1;
  std::vector<int> sizes{64, 32};
  Inner inner{};
  static constexpr auto fields() {
    using S = Settings;
    return std::tuple(cli::field("max_epochs", &S::max_epochs, "epochs"), cli::field("max_steps", &S::max_steps, "steps"),
                      cli::field("lr", &S::lr, "learning rate"), cli::field("name", &S::name, "a name"),
                      cli::field("mode", &S::mode, "min or max"), cli::field("max_time", &S::max_time, "wall time"),
                      cli::field("devices", &S::devices, "count or names"), cli::field("sizes", &S::sizes, "layer sizes"),
                      cli::field("inner", &S::inner, "nested"));
  }
};

struct StopArgs {
  std::string monitor;
  std::int64_t patience = 3;
  static constexpr auto fields() {
    return std::tuple(cli::field("monitor", &StopArgs::monitor, "metric"), cli::field("patience", &StopArgs::patience, "checks"));
  }
};

}  // namespace

template <>
struct fulgur::cli::enum_names<Mode> {
  static constexpr std::array values{std::pair{Mode::min, std::string_view("min")}, std::pair{Mode::max, std::string_view("max")}};
};

namespace {

cli::Schema test_schema() {
  cli::Schema trainer = cli::group("trainer", "", cli::schema_of<Settings>());
  cli::Schema callbacks;
  callbacks.name = "callbacks";
  callbacks.kind = cli::Schema::Kind::class_list;
  callbacks.default_value = YAML::Node(YAML::NodeType::Sequence);
  callbacks.choices.push_back({.name = "EarlyStopping", .aliases = {"lightning.pytorch.callbacks.EarlyStopping"},
                               .doc = "", .init_args = cli::schema_of<StopArgs>()});
  callbacks.choices.push_back({.name = "LearningRateMonitor", .aliases = {}, .doc = "", .init_args = {}});
  trainer.children.push_back(callbacks);
  cli::Schema strategy;
  strategy.name = "strategy";
  strategy.kind = cli::Schema::Kind::class_one;
  strategy.default_value = YAML::Load("{class_path: auto, init_args: {}}");
  strategy.choices.push_back({.name = "auto", .aliases = {}, .doc = "", .init_args = {}});
  strategy.choices.push_back({.name = "ddp", .aliases = {"DDPStrategy"}, .doc = "", .init_args = cli::schema_of<Inner>()});
  trainer.children.push_back(strategy);
  cli::Schema root = cli::group("", "", {trainer});
  root.children.push_back(cli::group("model", "", cli::schema_of<StopArgs>()));
  return root;
}

cli::Source set(std::string key, std::string value) { return {cli::Source::Kind::set, std::move(key), std::move(value)}; }

std::string write_file(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / ("fulgur_cli_" + name);
  std::ofstream(path) << text;
  return path.string();
}

/// The one problem a source gives.
std::string problem_of(const std::vector<cli::Source>& sources) {
  static const cli::Schema schema = test_schema();
  cli::Config config(schema);
  for (const auto& s : sources) config.apply(s);
  REQUIRE(config.problems().size() == 1);
  return config.problems().front();
}

}  // namespace

TEST_CASE("cli: defaults, then files and overrides in command-line order", "[cli]") {
  const cli::Schema schema = test_schema();
  cli::Config config(schema);
  const auto first = write_file("first.yaml", "trainer:\n  max_epochs: 5\n  lr: 0.1\n  inner:\n    code: 3\n");
  const auto second = write_file("second.yaml", "trainer:\n  max_epochs: 7\n");
  config.apply({cli::Source::Kind::file, "", first});
  config.apply(set("trainer.max_epochs", "6"));
  config.apply(set("trainer.lr", "3e-4"));
  config.apply({cli::Source::Kind::file, "", second});
  REQUIRE(config.problems().empty());
  const Settings s = cli::read_as<Settings>(config.tree()["trainer"], "trainer");
  CHECK(s.max_epochs == 7);        // the second file came last
  CHECK(s.lr == 3e-4);             // the override after the first file
  CHECK(s.inner.code == 3);        // a nested key merged, its sibling kept
  CHECK(s.inner.enabled);
  CHECK(s.name == "run");
  CHECK(s.max_steps == -1);
}

TEST_CASE("cli: every value type reads from YAML and prints back to the same text", "[cli]") {
  const cli::Schema schema = test_schema();
  cli::Config config(schema);
  for (const auto& [k, v] : std::vector<std::pair<std::string, std::string>>{
           {"trainer.max_epochs", "null"}, {"trainer.lr", "1.0"}, {"trainer.name", "123"}, {"trainer.mode", "max"},
           {"trainer.max_time", "00:01:30:00"}, {"trainer.devices", "'0,1'"}, {"trainer.sizes", "[8, 4]"},
           {"model.monitor", "val_loss"}, {"trainer.strategy", "ddp"}, {"trainer.strategy.code", "9"},
           {"trainer.callbacks", "[LearningRateMonitor, EarlyStopping]"}, {"trainer.callbacks.monitor", "#1: x"}})
    config.apply(set(k, v));
  INFO(Catch::Detail::stringify(config.problems()));
  REQUIRE(config.problems().empty());
  const Settings s = cli::read_as<Settings>(config.tree()["trainer"], "trainer");
  CHECK(!s.max_epochs);
  CHECK(s.name == "123");
  CHECK(s.mode == Mode::max);
  CHECK(s.max_time->count() == 5400.0);
  CHECK(std::get<std::string>(s.devices) == "0,1");
  CHECK(s.sizes == std::vector<int>{8, 4});
  const std::string text = cli::to_yaml_text(config.tree());
  CHECK_THAT(text, Catch::Contains("lr: 1.0\n"));            // still a float when read back
  CHECK_THAT(text, Catch::Contains("name: \"123\"\n"));      // still a string
  CHECK_THAT(text, Catch::Contains("monitor: \"#1: x\"\n"));  // quoted where YAML would misread it
  CHECK_THAT(text, Catch::Contains("- LearningRateMonitor\n"));

  // print -> read -> print: the same text, and the same values.
  const auto printed = write_file("printed.yaml", text);
  cli::Config again(schema);
  again.apply({cli::Source::Kind::file, "", printed});
  REQUIRE(again.problems().empty());
  CHECK(cli::to_yaml_text(again.tree()) == text);
  const Settings t = cli::read_as<Settings>(again.tree()["trainer"], "trainer");
  CHECK(t.name == "123");
  CHECK(std::get<std::string>(t.devices) == "0,1");
  CHECK(t.lr == 1.0);
}

// Found by tests/fuzz/readers.cpp (fuzz.cli): hours beyond a long long's seconds printed as a negative
// "DD:HH:MM:SS" that did not read back.
TEST_CASE("cli: a duration too long for DD:HH:MM:SS prints as seconds and reads back the same", "[cli][fuzz]") {
  const cli::Schema schema = test_schema();
  cli::Config config(schema);
  config.apply(set("trainer.max_time", "00:0184467440737095516160:10:00"));
  REQUIRE(config.problems().empty());
  const std::string text = cli::to_yaml_text(config.tree());
  CHECK_THAT(text, !Catch::Contains("max_time: \"-"));
  cli::Config again(schema);
  again.apply({cli::Source::Kind::text, "printed", text});
  INFO(text);
  REQUIRE(again.problems().empty());
  CHECK(cli::to_yaml_text(again.tree()) == text);
  CHECK(cli::read_as<Settings>(again.tree()["trainer"], "trainer").max_time->count() ==
        cli::read_as<Settings>(config.tree()["trainer"], "trainer").max_time->count());
}

// Found by fuzz.cli: bytes that are not UTF-8 were taken as they came, and their printed config did not
// read back; control characters and YAML 1.1's line breaks were printed in plain scalars.
TEST_CASE("cli: text that is not UTF-8 is refused, naming the byte and where", "[cli][fuzz]") {
  CHECK_THAT(problem_of({{cli::Source::Kind::text, "bad.yaml", "model:\n  monitor: val_\xE0@x\n"}}),
             Catch::StartsWith("bad.yaml: is not UTF-8 text (byte 0xE0 at offset 22)"));
  const auto file = write_file("latin1.yaml", "trainer:\n  name: caf\xE9\n");
  CHECK_THAT(problem_of({{cli::Source::Kind::file, "", file}}),
             Catch::StartsWith("--config " + file + ": is not UTF-8 text (byte 0xE9 at offset 20)"));
  CHECK_THAT(problem_of({set("trainer.name", "\xC0\xAF")}),  // an overlong '/'
             Catch::StartsWith("--trainer.name: the value is not UTF-8 text (byte 0xC0 at offset 0)"));
  CHECK_THAT(problem_of({set("trainer.name", "\xED\xA0\x80")}), Catch::Contains("byte 0xED"));  // a surrogate
  // UTF-8 of every length is read.
  const cli::Schema schema = test_schema();  // Config keeps a pointer to it
  cli::Config config(schema);
  config.apply(set("trainer.name", "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"));
  CHECK(config.problems().empty());
}

TEST_CASE("cli: control characters and YAML's line breaks in a value print escaped and read back", "[cli][fuzz]") {
  const cli::Schema schema = test_schema();
  for (const std::string value : {"a\x01b", "carriage\rreturn", "del\x7F", "nel\xC2\x85x",
                                  "ls\xE2\x80\xA8ps\xE2\x80\xA9", "tab\tand\nnewline", "\x1B[31mred"}) {
    cli::Config config(schema);
    config.apply(set("trainer.name", value));
    REQUIRE(config.problems().empty());
    const std::string text = cli::to_yaml_text(config.tree());
    INFO(text);
    // Only YAML's printable characters (PyYAML, which reads the printed config for Lightning, refuses
    // the others) and no YAML 1.1 line break (PyYAML would read one as a new line).
    CHECK(std::none_of(text.begin(), text.end(),
                       [](char c) { return (c >= 0 && c < 0x20 && c != '\n') || c == 0x7F; }));
    for (const char* line_break : {"\xC2\x85", "\xE2\x80\xA8", "\xE2\x80\xA9"})
      CHECK(text.find(line_break) == std::string::npos);
    cli::Config again(schema);
    again.apply({cli::Source::Kind::text, "printed", text});
    REQUIRE(again.problems().empty());
    CHECK(cli::read_as<Settings>(again.tree()["trainer"], "trainer").name == value);
    CHECK(cli::to_yaml_text(again.tree()) == text);
  }
}

TEST_CASE("cli: a str key takes the command line's text as written, and values print normalised", "[cli]") {
  const cli::Schema schema = test_schema();
  cli::Config config(schema);
  config.apply(set("trainer.name", "{epoch}-{val_loss:.2f}"));  // YAML would read a mapping
  config.apply(set("model.monitor", "x #y"));                    // YAML would drop the comment
  config.apply(set("trainer.lr", "1e-3"));                       // printed as 0.001: PyYAML reads 1e-3 as a string
  REQUIRE(config.problems().empty());
  CHECK(cli::read_as<Settings>(config.tree()["trainer"], "").name == "{epoch}-{val_loss:.2f}");
  CHECK(cli::read_as<StopArgs>(config.tree()["model"], "").monitor == "x #y");
  const std::string text = cli::to_yaml_text(config.tree());
  CHECK_THAT(text, Catch::Contains("lr: 0.001\n") && Catch::Contains("name: \"{epoch}-{val_loss:.2f}\"\n") &&
                       Catch::Contains("monitor: \"x #y\"\n"));
  // A str key is a text: on the command line "null" is that text; in a file null is refused (str | null,
  // an optional<std::string>, takes it).
  cli::Config null_text(schema);
  null_text.apply(set("trainer.name", "null"));
  CHECK(cli::read_as<Settings>(null_text.tree()["trainer"], "").name == "null");
  const auto null_file = write_file("null.yaml", "trainer:\n  name: null\n");
  CHECK(problem_of({{cli::Source::Kind::file, "", null_file}}) == null_file + ":2:9: trainer.name: expected str, got null");
  // In a file, a flow mapping where a text is expected says to quote it.
  const auto file = write_file("filename.yaml", "trainer:\n  name: {epoch}\n");
  CHECK_THAT(problem_of({{cli::Source::Kind::file, "", file}}), Catch::Contains("quote a text that starts with '{'"));
  CHECK(cli::number_text(1e-20) == "1.0e-20");
}

TEST_CASE("cli: numbers print in their shortest exact form", "[cli]") {
  for (double x : {0.1, 1e-3, 3e-4, 1.0 / 3.0, 1e20, 2.5, 0.0}) {
    const std::string text = cli::number_text(x);
    CHECK(*cli::as_number(YAML::Node(text)) == x);
    CHECK(text.find_first_of(".e") != std::string::npos);
  }
}

TEST_CASE("cli: an unknown key names itself and the closest valid key", "[cli]") {
  CHECK(problem_of({set("trainer.max_epoch", "3")}) ==
        "--trainer.max_epoch=3: unknown key 'trainer.max_epoch'; did you mean trainer.max_epochs?");
  CHECK_THAT(problem_of({set("max_epochs", "3")}), Catch::Contains("did you mean trainer.max_epochs?"));
  CHECK_THAT(problem_of({set("trainer.inner.cod", "3")}), Catch::Contains("did you mean trainer.inner.code?"));
  // Case aside (the probe: MAX_EPOCHS had no guess where max_epoch had one).
  CHECK_THAT(problem_of({set("trainer.MAX_EPOCHS", "3")}), Catch::Contains("did you mean trainer.max_epochs?"));
  CHECK_THAT(problem_of({set("MAX_EPOCHS", "3")}), Catch::Contains("did you mean trainer.max_epochs?"));
  const auto file = write_file("typo.yaml", "trainer:\n  lr: 0.1\n  max_step: 10\n");
  CHECK(problem_of({{cli::Source::Kind::file, "", file}}) ==
        file + ":3:3: unknown key 'trainer.max_step'; did you mean trainer.max_steps?");
  // Nothing close: no guess.
  CHECK(problem_of({set("trainer.zzzzzzzz", "1")}) == "--trainer.zzzzzzzz=1: unknown key 'trainer.zzzzzzzz'");
}

TEST_CASE("cli: a wrong type names the key, the value and the expected type", "[cli]") {
  CHECK(problem_of({set("trainer.max_epochs", "ten")}) ==
        "--trainer.max_epochs=ten: trainer.max_epochs: expected int | null, got 'ten'");
  CHECK(problem_of({set("trainer.mode", "median")}) ==
        "--trainer.mode=median: trainer.mode: expected min | max, got 'median'");
  CHECK_THAT(problem_of({set("trainer.lr", "[1, 2]")}), Catch::Contains("expected float, got a list"));
  const auto file = write_file("types.yaml", "trainer:\n  inner:\n    enabled: maybe\n");
  CHECK(problem_of({{cli::Source::Kind::file, "", file}}) ==
        file + ":3:14: trainer.inner.enabled: expected bool, got 'maybe'");
}

TEST_CASE("cli: a YAML syntax error names the file, line and column", "[cli]") {
  const auto file = write_file("broken.yaml", "trainer:\n  max_epochs: 3\n  lr: [0.1\n");
  const std::string problem = problem_of({{cli::Source::Kind::file, "", file}});
  CHECK_THAT(problem, Catch::StartsWith(file + ":4:1: YAML syntax error"));
  CHECK_THAT(problem_of({{cli::Source::Kind::file, "", "/nonexistent/x.yaml"}}), Catch::Contains("no such file"));
  // A tab in the indentation, which yaml-cpp reports as "illegal map value": the line is named.
  const auto tabbed = write_file("tabbed.yaml", "trainer:\n\tmax_epochs: 3\n");
  CHECK_THAT(problem_of({{cli::Source::Kind::file, "", tabbed}}),
             Catch::StartsWith(tabbed + ":2:12: YAML syntax error: ") &&
                 Catch::EndsWith("(line 2 is indented with a tab: YAML indents with spaces only)"));
  CHECK_THAT(problem, !Catch::Contains("tab"));
}

TEST_CASE("cli: a key given twice in a config file is named with both lines, not silently the last", "[cli]") {
  const auto file = write_file("twice.yaml", "trainer:\n  max_epochs: 3\n  lr: 0.1\n  max_epochs: 5\n");
  CHECK(problem_of({{cli::Source::Kind::file, "", file}}) ==
        file + ":4:3: trainer.max_epochs is given twice in this mapping (first at line 2); keep one: YAML would "
               "keep only the last");
  const auto top = write_file("twice_top.yaml", "trainer:\n  lr: 0.1\ntrainer:\n  max_epochs: 2\n");
  CHECK_THAT(problem_of({{cli::Source::Kind::file, "", top}}),
             Catch::StartsWith(top + ":3:1: trainer is given twice in this mapping (first at line 1)"));
  const auto listed = write_file("twice_listed.yaml",
                                 "trainer:\n  callbacks:\n  - class_path: lightning.pytorch.callbacks.EarlyStopping\n"
                                 "    init_args:\n      monitor: val_loss\n      patience: 5\n      monitor: val_acc\n");
  CHECK_THAT(problem_of({{cli::Source::Kind::file, "", listed}}),
             Catch::StartsWith(listed + ":7:7: trainer.callbacks[0].init_args.monitor is given twice in this "
                                        "mapping (first at line 5)"));
  // An alias that points back into itself, or one node reached twice: read once (no endless scan, no second report).
  const auto looped = write_file("alias_loop.yaml", "loop: &a [*a]\n");
  CHECK_THAT(problem_of({{cli::Source::Kind::file, "", looped}}), Catch::Contains("unknown key 'loop'"));
  const auto shared = write_file("alias_shared.yaml", "x: &a {k: 1, k: 2}\ny: *a\n");
  const cli::Schema aliased_schema = test_schema();
  cli::Config aliased(aliased_schema);
  aliased.apply({cli::Source::Kind::file, "", shared});
  CHECK(std::ranges::count_if(aliased.problems(), [](const std::string& p) { return p.find("given twice") != std::string::npos; }) == 1);
  // Reported with the file's other problems, not instead of them (the probe).
  const auto several = write_file("twice_and_more.yaml", "trainer:\n  max_epochs: 3\n  max_epochs: 4\n  lr: fast\n");
  const cli::Schema schema = test_schema();
  cli::Config config(schema);
  config.apply({cli::Source::Kind::file, "", several});
  REQUIRE(config.problems().size() == 2);
  CHECK_THAT(config.problems()[0], Catch::Contains("trainer.max_epochs is given twice"));
  CHECK_THAT(config.problems()[1], Catch::Contains("trainer.lr: expected float, got 'fast'"));
}

TEST_CASE("cli: a config file with a second YAML document is refused, not read in part (probe)", "[cli]") {
  const auto file = write_file("two_documents.yaml", "trainer:\n  max_epochs: 1\n---\ntrainer:\n  max_epochs: 5\n");
  CHECK(problem_of({{cli::Source::Kind::file, "", file}}) ==
        file + ":3:1: a second YAML document ('---') in one config file; fulgur reads one: merge them, or give each "
               "with its own --config");
  // Text on which yaml-cpp's LoadAll never ends (it yields document after document at one place; fuzz.cli).
  const auto endless = write_file("endless_documents.yaml", ",rgs\n-he--help\n");
  const cli::Schema schema = test_schema();
  cli::Config endless_config(schema);
  endless_config.apply({cli::Source::Kind::file, "", endless});  // ends, and finds no second document
  for (const std::string& problem : endless_config.problems()) CHECK_THAT(problem, !Catch::Contains("second YAML"));
  // A document marker before the only document is one document.
  const auto marked = write_file("marked.yaml", "---\ntrainer:\n  max_epochs: 2\n");
  cli::Config config(schema);
  config.apply({cli::Source::Kind::file, "", marked});
  CHECK(config.problems().empty());
}

TEST_CASE("cli: classes by name or class_path, appended, with init_args checked", "[cli]") {
  const cli::Schema schema = test_schema();
  cli::Config config(schema);
  const auto file = write_file("callbacks.yaml",
                               "trainer:\n  callbacks:\n  - class_path: lightning.pytorch.callbacks.EarlyStopping\n"
                               "    init_args:\n      monitor: val_loss\n      patience: 5\n");
  config.apply({cli::Source::Kind::file, "", file});
  config.apply({cli::Source::Kind::append, "trainer.callbacks", "EarlyStopping"});
  config.apply(set("trainer.callbacks.patience", "9"));  // the last one's
  config.apply(set("trainer.callbacks.init_args.monitor", "train_loss"));
  REQUIRE(config.problems().empty());
  const YAML::Node callbacks = config.tree()["trainer"]["callbacks"];
  REQUIRE(callbacks.size() == 2);
  CHECK(callbacks[0]["class_path"].Scalar() == "EarlyStopping");  // Lightning's class path, read as the short name
  CHECK(cli::read_as<StopArgs>(callbacks[0]["init_args"], "").patience == 5);
  const StopArgs second = cli::read_as<StopArgs>(callbacks[1]["init_args"], "");
  CHECK(second.patience == 9);
  CHECK(second.monitor == "train_loss");

  CHECK(problem_of({set("trainer.callbacks", "EarlyStoping")}) ==
        "--trainer.callbacks=EarlyStoping: trainer.callbacks[0]: 'EarlyStoping' is not a class this program compiled "
        "for it; it takes EarlyStopping, LearningRateMonitor (did you mean EarlyStopping?)");
  CHECK(problem_of({set("trainer.callbacks", "{class_path: EarlyStopping, init_args: {patiense: 2}}")}) ==
        "--trainer.callbacks={class_path: EarlyStopping, init_args: {patiense: 2}}: trainer.callbacks[0] "
        "(EarlyStopping): unknown key 'patiense'; did you mean patience?");
  CHECK_THAT(problem_of({set("trainer.callbacks", "{class_path: EarlyStopping, init_args: {patience: soon}}")}),
             Catch::Contains("trainer.callbacks[0].init_args.patience: expected int, got 'soon'"));
  CHECK_THAT(problem_of({set("trainer.callbacks.patience", "2")}),
             Catch::Contains("holds no class to set 'patience' on; add one first"));
  CHECK_THAT(problem_of({{cli::Source::Kind::append, "trainer.max_steps", "2"}}), Catch::Contains("'+=' appends"));
}

TEST_CASE("cli: a class slot keeps its init_args while its class stays", "[cli]") {
  const cli::Schema schema = test_schema();
  cli::Config config(schema);
  config.apply(set("trainer.strategy", "DDPStrategy"));
  config.apply(set("trainer.strategy.code", "11"));
  config.apply(set("trainer.strategy", "ddp"));  // the same class: code stays 11
  REQUIRE(config.problems().empty());
  CHECK(config.tree()["trainer"]["strategy"]["class_path"].Scalar() == "ddp");
  CHECK(cli::read_as<Inner>(config.tree()["trainer"]["strategy"]["init_args"], "").code == 11);
  CHECK_THAT(problem_of({set("trainer.strategy.code", "1")}), Catch::Contains("auto takes no init_args"));
}

TEST_CASE("cli: the environment is read only with --env_prefix", "[cli]") {
  const cli::Schema schema = test_schema();
  ::setenv("FULGURTEST_TRAINER__MAX_STEPS", "42", 1);
  ::setenv("FULGURTEST_TRAINER__INNER__CODE", "4", 1);
  cli::Config plain(schema);
  CHECK(cli::read_as<Settings>(plain.tree()["trainer"], "").max_steps == -1);
  const auto command = cli::parse_command_line({"prog", "fit", "--env_prefix", "FULGURTEST", "--trainer.lr=0.5"}, {"fit"});
  CHECK(command.env_prefix == "FULGURTEST");
  cli::Config with_env(schema);
  with_env.read_environment(command.env_prefix);
  for (const auto& s : command.sources) with_env.apply(s);
  const Settings s = cli::read_as<Settings>(with_env.tree()["trainer"], "");
  CHECK(s.max_steps == 42);
  CHECK(s.inner.code == 4);
  CHECK(s.lr == 0.5);
  ::unsetenv("FULGURTEST_TRAINER__MAX_STEPS");
  ::unsetenv("FULGURTEST_TRAINER__INNER__CODE");
}

TEST_CASE("cli: the command line's subcommand, options and flags", "[cli]") {
  const std::vector<std::string> subcommands{"fit", "validate", "test", "predict"};
  const auto command = cli::parse_command_line(
      {"/bin/prog", "fit", "--config", "a.yaml", "--trainer.max_epochs", "3", "--trainer.callbacks+=EarlyStopping",
       "--print_config", "--config=b.yaml"},
      subcommands);
  CHECK(command.program == "prog");
  CHECK(command.subcommand == "fit");
  CHECK(command.print_config);
  REQUIRE(command.sources.size() == 4);
  CHECK(command.sources[0].kind == cli::Source::Kind::file);
  CHECK(command.sources[1].key == "trainer.max_epochs");
  CHECK(command.sources[1].text == "3");
  CHECK(command.sources[2].kind == cli::Source::Kind::append);
  CHECK(command.sources[3].text == "b.yaml");
  auto error_of = [&](std::vector<std::string> args) {
    try {
      cli::parse_command_line(args, subcommands);
    } catch (const cli::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(error_of({"prog"}), Catch::Contains("give a subcommand: fit, validate, test, predict"));
  CHECK_THAT(error_of({"prog", "fir"}), Catch::Contains("'fir' is not a subcommand") && Catch::Contains("did you mean fit?"));
  CHECK_THAT(error_of({"prog", "fit", "--config"}), Catch::Contains("--config needs a value"));
  CHECK_THAT(error_of({"prog", "fit", "stray"}), Catch::Contains("'stray': expected an option"));
  CHECK(cli::parse_command_line({"prog", "--help"}, subcommands).help);
  // A program that runs only some of them lists those (probe 8: `train` was told test and predict).
  auto offered_error = [&](std::vector<std::string> args) {
    try {
      cli::parse_command_line(args, subcommands, {"fit", "validate"});
    } catch (const cli::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(offered_error({"prog", "train"}), Catch::Contains("the first argument is one of fit, validate,"));
  CHECK_THAT(offered_error({"prog"}), Catch::Contains("give a subcommand: fit, validate ("));
  // A known one it lacks still parses: run() says what the program lacks for it.
  CHECK(cli::parse_command_line({"prog", "test"}, subcommands, {"fit", "validate"}).subcommand == "test");
}

TEST_CASE("cli: all problems are reported together", "[cli]") {
  const cli::Schema schema = test_schema();
  cli::Config config(schema);
  config.apply(set("trainer.max_epoch", "1"));
  config.apply(set("trainer.lr", "fast"));
  REQUIRE(config.problems().size() == 2);
  try {
    config.throw_if_problems();
    FAIL("no error");
  } catch (const cli::ConfigError& e) {
    CHECK_THAT(e.what(), Catch::StartsWith("fulgur::cli: 2 problems:") && Catch::Contains("max_epoch") &&
                             Catch::Contains("fast"));
  }
}

TEST_CASE("cli: the loggers' hyper-parameters are the config's keys, flat", "[cli]") {
  const cli::Schema schema = test_schema();
  cli::Config config(schema);
  config.apply(set("trainer.max_epochs", "4"));
  config.apply(set("trainer.callbacks", "EarlyStopping"));
  const fulgur::Hyperparameters flat = cli::flatten(config.tree());
  auto value_of = [&](const std::string& key) {
    for (const auto& [k, v] : flat)
      if (k == key) return v;
    FAIL("no key " << key);
    return fulgur::HyperparameterValue{};
  };
  CHECK(std::get<std::int64_t>(value_of("trainer.max_epochs")) == 4);
  CHECK(std::get<double>(value_of("trainer.lr")) == 1e-3);
  CHECK(std::get<std::string>(value_of("trainer.name")) == "run");
  CHECK(std::get<bool>(value_of("trainer.inner.enabled")));
  CHECK_THAT(std::get<std::string>(value_of("trainer.callbacks")), Catch::Contains("EarlyStopping"));
}

TEST_CASE("cli: what the new-user probe found", "[cli]") {
  // An environment variable's bad value names the variable, not a command-line option.
  ::setenv("FULGURPROBE_TRAINER__LR", "abc", 1);
  const cli::Schema schema = test_schema();
  cli::Config env(schema);
  env.read_environment("FULGURPROBE");
  ::unsetenv("FULGURPROBE_TRAINER__LR");
  REQUIRE(env.problems().size() == 1);
  CHECK(env.problems()[0] == "environment variable FULGURPROBE_TRAINER__LR=abc: trainer.lr: expected float, got 'abc'");
  // A folder given as a config file.
  CHECK(problem_of({{cli::Source::Kind::file, "", std::filesystem::temp_directory_path().string()}}) ==
        "--config " + std::filesystem::temp_directory_path().string() + ": is a directory; give a YAML file");
  // An init_arg's error points at its own line.
  const auto file = write_file("init_args.yaml", "trainer:\n  callbacks:\n  - class_path: EarlyStopping\n"
                                                 "    init_args:\n      monitor: val_loss\n      patiense: 3\n");
  CHECK(problem_of({{cli::Source::Kind::file, "", file}}) ==
        file + ":6:7: trainer.callbacks[0] (EarlyStopping): unknown key 'patiense'; did you mean patience?");
  CHECK_THAT(problem_of({set("trainer.callbacks", "{class_path: EarlyStopping, initargs: {patience: 2}}")}),
             Catch::Contains("unknown key 'initargs'; did you mean init_args?"));
  // A key cut short is still recognised.
  CHECK_THAT(problem_of({set("trainer.strategy", "ddp"), set("trainer.strategy.enab", "true")}),
             Catch::Contains("did you mean enabled?"));
  // A section with its keys commented out is an empty section.
  cli::Config empty(schema);
  empty.apply({cli::Source::Kind::file, "", write_file("empty_section.yaml", "trainer:\n  # max_epochs: 3\nmodel:\n")});
  CHECK(empty.problems().empty());
  CHECK_FALSE(cli::parse_command_line({"prog", "fit", "--print_config=false"}, {"fit"}).print_config);
  CHECK(cli::parse_command_line({"prog", "fit", "--print_config=true"}, {"fit"}).print_config);
}

TEST_CASE("cli: a list slot that takes true/false takes null as its default (Lightning's logger: null)", "[cli]") {
  cli::Schema logger;
  logger.name = "logger";
  logger.kind = cli::Schema::Kind::class_list;
  logger.takes_bool = true;
  logger.default_value = YAML::Load("[{class_path: TensorBoardLogger, init_args: {}}]");
  logger.choices.push_back({.name = "TensorBoardLogger", .aliases = {}, .doc = "", .init_args = {}});
  logger.choices.push_back({.name = "CSVLogger", .aliases = {}, .doc = "", .init_args = {}});
  const cli::Schema root = cli::group("", "", {cli::group("trainer", "", {logger})});
  auto loggers_after = [&](std::vector<cli::Source> sources) {
    cli::Config config(root);
    for (const auto& s : sources) config.apply(s);
    REQUIRE(config.problems().empty());
    std::string names;
    for (const auto& e : config.tree()["trainer"]["logger"]) names += e["class_path"].Scalar() + " ";
    return names;
  };
  CHECK(loggers_after({}) == "TensorBoardLogger ");
  CHECK(loggers_after({set("trainer.logger", "CSVLogger"), set("trainer.logger", "null")}) == "TensorBoardLogger ");
  CHECK(loggers_after({set("trainer.logger", "false")}).empty());
  CHECK(loggers_after({set("trainer.logger", "[]")}).empty());
  CHECK(loggers_after({set("trainer.logger", "CSVLogger"), {cli::Source::Kind::append, "trainer.logger", "TensorBoardLogger"}}) ==
        "CSVLogger TensorBoardLogger ");
}

TEST_CASE("cli: a bad item of a list in a file is named by its own index and line", "[cli]") {
  const auto file = write_file("items.yaml", "trainer:\n  callbacks:\n  - EarlyStopping\n  - Timr\n");
  CHECK(problem_of({{cli::Source::Kind::file, "", file}}) ==
        file + ":4:5: trainer.callbacks[1]: 'Timr' is not a class this program compiled for it; it takes "
               "EarlyStopping, LearningRateMonitor");
}
