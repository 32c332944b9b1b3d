# cli_bins.sh — sourced by the CLI test scripts (t_cli.sh, t_mkmodel.sh, t_diag.sh): which binaries they
# run. Paths are relative to the repository root, the directory the scripts run in.
#   BIN       $BUILD/isobatch (BUILD defaults to build);
#   ASAN_BIN  the sanitizer build's isobatch, $ASAN_BUILD/isobatch (ASAN_BUILD defaults to build-asan),
#             whether or not it exists (each script decides what its absence means);
#   the sanitizers' options exported (leaks reported, UBSan stops at the first error with a stack).
BUILD=${BUILD:-build}
BIN=$BUILD/isobatch
ASAN_BIN=${ASAN_BUILD:-build-asan}/isobatch
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
