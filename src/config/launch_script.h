// A Megatron-LM / MindSpeed-LLM launch as users keep it: the shell script that runs
// `torchrun ... pretrain_gpt.py --num-layers 32 ...`, a training log holding Megatron's printed
// `---- arguments ----` block, or the arguments themselves. Reading one yields the training
// script's arguments in order, each with the line it was written on, the launcher's world size,
// and a warning for everything the reader could not evaluate (naming the line and the value it
// took). What the arguments mean is not decided here (megatron_args.h does that).
// Deliberately not a shell: no command is run and no file is read but the one given. The reader
// evaluates what decides the training command from the script's own text, as bash(1) would:
// variables, arrays, `${...}` (defaults, `${#x}`, `${x%pat}` `${x%%pat}` `${x#pat}` `${x##pat}`,
// `${x:off:len}`), `$((...))` in bash's 64-bit wrap-around arithmetic, `if`/`elif`/`else` on
// `[ ]`, `[[ ]]`, `test`, `(( ))`, `true`/`false` and `&&`/`||` lists, `case ... esac` with glob
// patterns, functions (defined and called, with $1 ... and `return`), `eval` of a built command,
// `exit`, heredocs (skipped), the script's own arguments ($1 ... as the caller gives them), and
// variables the caller pins (`--script-var NAME=VALUE`: set before the first line, and every
// assignment the script makes to NAME ignored, as `make NAME=VALUE` overrides a makefile's).
// What it cannot evaluate is a warning naming the line and the value it took: a condition on a
// file or a command's status (the first branch of the `if` is taken), loops (skipped), `$(cmd)`,
// `${x/a/b}`, `=~`, `source`.
// Bounds (memsim's, stated so that a hostile or runaway script is refused, never a crash or an
// endless read): below, kLaunchScript*. Exceeding one is an InputError "<label>:<line>: ...".
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace memsim::config {

// Nesting of `$(( ( ... ) ))` parentheses and unary operators, `${..${..}..}` expansions,
// `if`/`case`/`{` blocks, function calls and `eval`: at most 100 levels (bash has no stated limit;
// launch scripts use a handful).
inline constexpr int kLaunchScriptMaxNesting = 100;
// A word or a variable's value: at most 256 KiB (a real script's longest, its argument string,
// is a few KiB).
inline constexpr std::size_t kLaunchScriptMaxWordBytes = std::size_t{256} << 10;
// An array's elements, and the fields of one command: at most 16,384.
inline constexpr std::size_t kLaunchScriptMaxElements = 16384;
// All variables' values together: at most 64 MiB.
inline constexpr std::size_t kLaunchScriptMaxTotalBytes = std::size_t{64} << 20;
// Commands run (function calls and `eval` included): at most 1,000,000.
inline constexpr std::int64_t kLaunchScriptMaxCommands = 1'000'000;
// Warnings (and notes, and hints) kept of one reading: at most 10,000; the rest are counted.
inline constexpr std::size_t kLaunchScriptMaxWarnings = 10000;

// One argument of the training script: "--num-layers" with its values ({"32"}), as written; a
// flag without a value (store_true) has none, one with nargs="+" several. From a training log,
// `name` is Megatron's attribute name ("num_layers") and the one value is Python's repr of it
// ("32", "True", "None", "['core_attn']", "AttnBackend.flash").
struct LaunchArgument {
  std::string name;
  std::vector<std::string> values;
  int line = 0;  // 1-based line of the source; 0 = the command line
  bool operator==(const LaunchArgument&) const = default;
};

struct MegatronLaunch {
  enum class Kind { kScript, kLog, kCommandLine };
  Kind kind = Kind::kScript;
  std::string label;  // the file as named on the command line, or "--megatron-args"
  std::vector<LaunchArgument> arguments;
  // Processes per node and nodes, from the launcher (torchrun --nproc_per_node / --nnodes, msrun
  // --local_worker_num / --worker_num) or the script's GPUS_PER_NODE / NPUS_PER_NODE and NNODES
  // / NUM_NODES; absent when the launch does not say.
  std::optional<int> nproc_per_node;
  std::optional<int> nnodes;
  int launch_line = 0;  // the line of the training command (script), or of the arguments block
  // "<label>:<line>: <what was not evaluated>; <the value taken>", in order of the lines.
  std::vector<std::string> warnings;
  // Values the script defaulted (`${VAR:-x}` with VAR unset), for --verbose.
  std::vector<std::string> notes;
  // "<label>:<line>: <flag>: its value <expansion> expanded to nothing (<why>)": an expansion
  // that gave nothing right after a --flag. Not printed on their own (a store_true flag followed
  // by an empty `$EXTRA_ARGS` is ordinary); a caller adds those of a line to an error about it.
  std::vector<std::string> hints;
  // The environment the script gives the training process: `export NAME=value`, `export NAME`
  // of a variable set before, and `NAME=value` words before the training command; in order of
  // the lines (a later one for the same name wins). Scripts only.
  struct Export {
    std::string name;
    std::string value;
    int line = 0;
    bool operator==(const Export&) const = default;
  };
  std::vector<Export> exports;
};

// A variable the caller pins (`--script-var NAME=VALUE`). `name` is a shell name
// ([A-Za-z_][A-Za-z0-9_]*; ParseScriptVariable checks it).
struct ScriptVariable {
  std::string name;
  std::string value;
  bool operator==(const ScriptVariable&) const = default;
};

// "NAME=VALUE" as a ScriptVariable. Throws InputError "<option> <text>: ..." when NAME is not a
// shell variable name.
ScriptVariable ParseScriptVariable(std::string_view text, std::string_view option);

// Reads a launch script; `script_args` are the script's own arguments ($1, $2, ...; "$@"), as the
// caller would give them to bash; `script_vars` are set before the first line and keep their
// value: the script's own assignments to them are skipped, and MegatronLaunch::warnings says, per
// variable, at which lines (or that the script never uses it). Throws InputError
// "<label>:<line>: ..." when the text cannot be read as a script (an unterminated quote or `$((`),
// bash would stop on it (division by zero in `$((...))`), a bound above is exceeded, or it holds
// no training command.
MegatronLaunch ReadLaunchScript(const std::string& label, std::string_view text,
                                const std::vector<std::string>& script_args = {},
                                const std::vector<ScriptVariable>& script_vars = {});

// Reads the `---- arguments ----` block of a Megatron training log. Throws InputError when the
// block is absent or unterminated.
MegatronLaunch ReadArgumentsLog(const std::string& label, std::string_view text);

// True iff `text` holds Megatron's printed arguments block (a line "---- arguments ----").
bool LooksLikeArgumentsLog(std::string_view text);

// The training script's arguments given on the command line (`--megatron-args -- ARGS...`).
MegatronLaunch ReadCommandLineArguments(const std::vector<std::string>& words);

// Reads FILE as a training log when it holds an arguments block, else as a launch script.
// Throws InputError "<path>: cannot read the file: <why>" when it cannot be read, and when FILE
// is a log but `script_vars` are given (a log has no variables to pin).
MegatronLaunch ReadMegatronArgsFile(const std::string& path,
                                    const std::vector<std::string>& script_args = {},
                                    const std::vector<ScriptVariable>& script_vars = {});

}  // namespace memsim::config
