#!/usr/bin/env bash
# mkmodel's threads: every preset family, bit width and option below is written with --threads 1, 3
# and 4 (and once with the default, the CPUs online), and every file must be the same bytes, equal to
# the SHA-256 recorded from the single-threaded writer before it had threads (so the expected values
# do not come from the code under test). Bad --threads values (0, negative, over 256, not a number,
# missing) give a one-line error and a non-zero exit, under the ASan/UBSan build.
#
#   weights: SHA-256 of model.safetensors; aux: SHA-256 of config.json, tokenizer.json and
#   tokenizer_config.json concatenated.
set -u
. "$(dirname "$0")/cli_bins.sh"
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*"; }
[ -x "$ASAN_BIN" ] || { bad "$ASAN_BIN missing (run make asan): bad inputs run without ASan/UBSan"; ASAN_BIN=$BIN; }
T=$(mktemp -d /tmp/ib_mkmodel_sh_XXXXXX)
trap 'rm -rf "$T"' EXIT

# arguments | weights | aux (recorded with the single-threaded mkmodel of commit 32984fd)
GOLDEN=$(cat <<'EOF'
--preset tiny --seed 3 --bits 4 | b34b00e9561351dc6733ab9947519c828981522d1da5b75669c1df55524c5fff | e2db992a73173d84a6f6452db10b9552d02f8311d812b983d8a4cb7659c64c98
--preset tiny --seed 6 --bits 8 --group 128 --untied | 60b6f5dd3982576f30dd48ecd694968c94a46f355f7d6c7608998803bc65a004 | 45e9702087db092297423d385909676006ba5b7f9756efb24e7564d0c97a2f8c
--preset tiny --seed 7 --bits 16 --arch llama | f03a8e9b29406e2ebb7d4bca143f3348795b214d1b4ad22939b765ad62a4a2c8 | e39d5c58ff2369f97a91ad84dc7ee1cd6da35f628d43644fad574f639bf1ad8d
--preset tiny --seed 8 --bits 32 --untied | edeb3f44442677467be933b1d015eb3f089b6557497047cc2143c73828e472f0 | 41aedba19442466aa01db1223e00a9afe938e048b5b4087e93b3fd257a10913c
--preset qwen3-0.6b --layers 2 --seed 1 --bits 4 --group 32 | b2ffb9317034f3eb721b68e12da9c35162994b338bc6c2536dc5f7fe37992ee7 | e3f9d123086f63a9a04af57f470a3c3a6bef6606a62b42319b0bae7a5ea49399
--preset gemma4-moe-tiny --seed 2 --bits 4 | 88f703971fa7c0c9e2928bb49645c641dcea2a25cc1ee2b3b3f445938cc5169d | e4dedb55632fa005d5b02ec181e3827af759f911238ae06a1f8917989ad3783b
--preset gemma4-moe-tiny --seed 5 --bits 8 --group 32 --top-k 3 --layers 3 | b41da1c60b7282699294b08a7e82438d3d8a8471c5d30e558982f5cebf5ef7bb | eb46eedaccf7539e26445e16dd1959b67ed839ef60e5a61ecc9615ce5afb37f8
--preset gemma4-tiny --seed 4 --bits 4 --kv-shared 2 --double-wide --ple 64 | 5473fb38ed90e4aa4f0ac9011e751779cdeb20f36c908d9c2b6b0fa270eb0923 | 210fa69ca0a71847dd745d0a520090c035a553fa027dd84027457e40d251c822
--preset gemma4-tiny --seed 9 --bits 32 | 86a7b8d085f4a6459b1609a092ec22c16b9696e6cfc4f2686706c1d771d19de7 | d1abeeabc6f443f66e580849b1f60b0d38d817867ea77105449c7ad23ae41ec3
--preset gemma4-26b-a4b --layers 1 | 08b953b1db908fb2eb392718767af5ac2b5da8d8e915556790bb152452991552 | de370beced8ee4403b56a9b99dccc5d436c8b6750a831d0ab95a56513276257f
EOF
)

sha() { sha256sum "$@" | cut -c1-64; }
aux() { cat "$1/config.json" "$1/tokenizer.json" "$1/tokenizer_config.json" | sha256sum | cut -c1-64; }

while IFS='|' read -r args want_w want_a; do
    args=${args% }; want_w=${want_w// /}; want_a=${want_a// /}
    for threads in 1 3 4 default; do
        topt=(--threads "$threads"); [ "$threads" = default ] && topt=()
        # the default (the CPUs online) only on the small models: the large one is slow on a small host
        [ "$threads" = default ] && [[ "$args" == *gemma4-26b* ]] && continue
        rm -rf "$T/m"
        # shellcheck disable=SC2086
        if ! "$BIN" mkmodel $args "${topt[@]}" --out "$T/m" > "$T/out" 2>&1; then
            bad "mkmodel $args --threads $threads: $(cat "$T/out")"; continue
        fi
        got_w=$(sha "$T/m/model.safetensors"); got_a=$(aux "$T/m")
        [ "$got_w" = "$want_w" ] && ok || bad "mkmodel $args --threads $threads: model.safetensors $got_w, recorded $want_w"
        [ "$got_a" = "$want_a" ] && ok || bad "mkmodel $args --threads $threads: config/tokenizer files $got_a, recorded $want_a"
    done
done <<< "$GOLDEN"
rm -rf "$T/m"

# bad --threads (and --experts below): one line, non-zero exit, no crash (under the sanitizers)
expect_error() {
    local name=$1 want=$2; shift 2
    local err rc
    err=$("$@" 2>&1 >/dev/null); rc=$?
    if [ $rc = 0 ]; then bad "$name: exit 0"; return; fi
    if [ $rc -ge 128 ]; then bad "$name: crashed (exit $rc)"; return; fi
    if printf '%s' "$err" | grep -qE "AddressSanitizer|runtime error|LeakSanitizer"; then bad "$name: sanitizer: $err"; return; fi
    if ! printf '%s' "$err" | grep -qF -- "$want"; then bad "$name: message '$err' lacks '$want'"; return; fi
    if [ "$(printf '%s\n' "$err" | wc -l)" != 1 ]; then bad "$name: not one line: $err"; return; fi
    ok
}
for v in 0 -1 257 abc 4x "" 99999999999999999999; do
    expect_error "mkmodel --threads '$v'" "--threads: bad value '$v'" "$ASAN_BIN" mkmodel --preset tiny --threads "$v" --out "$T/bad"
done
expect_error "mkmodel -t 0" "-t: bad value '0'" "$ASAN_BIN" mkmodel --preset tiny -t 0 --out "$T/bad"
expect_error "mkmodel --threads (no value)" "--threads" "$ASAN_BIN" mkmodel --preset tiny --out "$T/bad" --threads
# bad --experts: out of range, or on a preset without experts
for v in 0 1025 -3 x; do
    expect_error "mkmodel --experts '$v'" "--experts: bad value '$v'" "$ASAN_BIN" mkmodel --preset gemma4-moe-tiny --experts "$v" --out "$T/bad"
done
expect_error "mkmodel --experts on a dense preset" "mkmodel: experts 4: only for the MoE presets" "$ASAN_BIN" mkmodel --preset gemma4-tiny --experts 4 --out "$T/bad"
[ ! -e "$T/bad" ] && ok || bad "a refused --threads or --experts still wrote $T/bad"
"$BIN" mkmodel --help | grep -q -- "--threads T" && ok || bad "mkmodel --help does not name --threads"

echo "t_mkmodel: $pass passed, $fail failed"
[ "$fail" = 0 ]
