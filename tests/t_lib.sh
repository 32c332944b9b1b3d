#!/usr/bin/env bash
# The linkable library: `make install` (PREFIX, DESTDIR) lays out the tool, libisobatch.a,
# libisobatch.so with its soname links, the header, the pkg-config files and the default model; the
# code examples of include/isobatch.h ("Typical use") and README.md ("The C API in brief") are cut out
# of those files, compiled against the installed library through pkg-config (shared and static) and
# run, so they cannot go stale; ib_version() of the shared library equals the header's
# IB_VERSION_STRING; the installed tool runs from anywhere and finds its default model.
set -u
BUILD=${BUILD:-build}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
case $BUILD in /*) BABS=$BUILD ;; *) BABS=$ROOT/$BUILD ;; esac
pass=0; fail=0
ok() { pass=$((pass+1)); }
bad() { fail=$((fail+1)); echo "FAIL: $*"; }
T=$(mktemp -d /tmp/ib_lib_XXXXXX)
trap 'rm -rf "$T"' EXIT
finish() { echo "t_lib: $pass passed, $fail failed"; [ "$fail" = 0 ]; exit; }
command -v pkg-config >/dev/null || { bad "pkg-config not found (apt-get install pkgconf)"; finish; }
V=$(sed -n 's/^#define IB_VERSION_STRING "\(.*\)"/\1/p' "$ROOT/include/isobatch.h")
[[ "$V" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] && ok || bad "IB_VERSION_STRING '$V' is not MAJOR.MINOR.PATCH"

# a staged install: everything under DESTDIR/PREFIX, nothing elsewhere
make -s -C "$ROOT" BUILD="$BABS" PREFIX=/opt/ib DESTDIR="$T/stage" install > "$T/stage.log" 2>&1 \
    && ok || { bad "make install DESTDIR: $(tail -5 "$T/stage.log")"; finish; }
for f in bin/isobatch lib/libisobatch.a "lib/libisobatch.so.$V" lib/libisobatch.so.0 lib/libisobatch.so \
         include/isobatch.h lib/pkgconfig/isobatch.pc lib/pkgconfig/isobatch-static.pc; do
    [ -e "$T/stage/opt/ib/$f" ] && ok || bad "make install: $f missing under DESTDIR/PREFIX"
done
[ "$(readlink "$T/stage/opt/ib/lib/libisobatch.so")" = libisobatch.so.0 ] && ok || bad "libisobatch.so does not point at the soname"
readelf -d "$T/stage/opt/ib/lib/libisobatch.so.$V" 2>/dev/null | grep -q 'SONAME.*\[libisobatch\.so\.0\]' && ok || bad "no SONAME libisobatch.so.0"
grep -qx 'prefix=/opt/ib' "$T/stage/opt/ib/lib/pkgconfig/isobatch.pc" && ok || bad "isobatch.pc: prefix is not the PREFIX given"
[ "$(find "$T/stage" -mindepth 1 -maxdepth 1)" = "$T/stage/opt" ] && ok || bad "make install wrote outside DESTDIR/PREFIX: $(ls "$T/stage")"
make -s -C "$ROOT" BUILD="$BABS" PREFIX=/opt/ib DESTDIR="$T/stage" uninstall > /dev/null 2>&1
[ -z "$(find "$T/stage" -type f -o -type l)" ] && ok || bad "make uninstall left $(find "$T/stage" -type f -o -type l | head -3)"

# a real install into a prefix, used through pkg-config
P=$T/prefix
make -s -C "$ROOT" BUILD="$BABS" PREFIX="$P" install > "$T/install.log" 2>&1 && ok || { bad "make install: $(tail -5 "$T/install.log")"; finish; }
export PKG_CONFIG_PATH=$P/lib/pkgconfig
[ "$(pkg-config --modversion isobatch)" = "$V" ] && ok || bad "pkg-config --modversion isobatch: $(pkg-config --modversion isobatch 2>&1)"
"$P/bin/isobatch" mkmodel --preset tiny --seed 2 --out "$T/tiny" > /dev/null || bad "mkmodel"

# the header's example: the lines of its "Typical use" block, inside a main() that gives dir, ids, n
{
    printf '#include <stdio.h>\n#include <stdlib.h>\n#include <isobatch.h>\n'
    printf 'int main(int argc, char **argv) {\n    const char *dir = argv[1];\n    const int32_t ids[] = {72, 101, 108, 108, 111};\n    int n = 5;\n'
    awk '/Typical use/{on=1; next} on && /^ \* [A-Z]/{exit} on && /^ \*     /{sub(/^ \*     /, "    "); print}' "$ROOT/include/isobatch.h"
    printf '    printf("%%d\\n", next);\n    return 0;\n}\n'
} > "$T/hdr.c"
[ "$(grep -c 'ib_' "$T/hdr.c")" -ge 6 ] && ok || bad "could not cut the example out of isobatch.h: $(cat "$T/hdr.c")"
# the same first token from the tool (greedy)
WANT=$("$P/bin/isobatch" generate -m "$T/tiny" --prompt-ids 72,101,108,108,111 -n 1 --ignore-eos --json 2>/dev/null \
       | sed -n 's/.*"tokens":\[\([0-9]*\)\].*/\1/p')
# shellcheck disable=SC2046
if cc -std=c11 -Wall -Werror -o "$T/hdr" "$T/hdr.c" $(pkg-config --cflags --libs isobatch) 2> "$T/cc.log"; then
    ok
    GOT=$(LD_LIBRARY_PATH=$P/lib "$T/hdr" "$T/tiny")
    [ -n "$WANT" ] && [ "$GOT" = "$WANT" ] && ok || bad "header example (shared) chose '$GOT', the tool '$WANT'"
    LD_LIBRARY_PATH=$P/lib ldd "$T/hdr" | grep -q "libisobatch.so.0 => $P/lib/libisobatch.so.0" \
        && ok || bad "header example is not linked to the shared library"
else
    bad "the header's example does not compile: $(head -5 "$T/cc.log")"
fi
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror -o "$T/hdr_static" "$T/hdr.c" $(pkg-config --cflags --libs isobatch-static) 2> "$T/cc.log" \
    && ok || bad "the header's example does not link statically: $(head -5 "$T/cc.log")"
ldd "$T/hdr_static" 2>/dev/null | grep -q libisobatch && bad "the static link still needs libisobatch.so" || ok
[ "$("$T/hdr_static" "$T/tiny" 2>/dev/null)" = "$WANT" ] && ok || bad "header example (static) differs from the tool"

# the README's example: its first C block after "## The C API in brief", inside the same main()
{
    printf '#include <stdio.h>\n#include <stdlib.h>\n#include <isobatch.h>\n'
    printf 'int main(int argc, char **argv) {\n    const char *dir = argv[1];\n    const int32_t ids[] = {72, 101, 108, 108, 111};\n    int n = 5;\n'
    awk '/^## The C API in brief/{sec=1} sec && /^```c/{on=1; next} on && /^```/{exit} on{print "    " $0}' "$ROOT/README.md"
    printf '    printf("%%d\\n", next);\n    return 0;\n}\n'
} > "$T/readme.c"
# shellcheck disable=SC2046
if cc -std=c11 -Wall -Wno-unused-variable -Werror -o "$T/readme" "$T/readme.c" $(pkg-config --cflags --libs isobatch) 2> "$T/cc.log"; then
    ok
    [ "$(LD_LIBRARY_PATH=$P/lib "$T/readme" "$T/tiny")" = "$WANT" ] && ok || bad "README example differs from the tool"
else
    bad "the README's C example does not compile: $(head -5 "$T/cc.log")"
fi

# ib_version() of the library loaded at run time equals the header's version
printf '#include <stdio.h>\n#include <string.h>\n#include <isobatch.h>\nint main(void) { printf("%%s %%s %%d\\n", ib_version(), IB_VERSION_STRING, IB_VERSION_NUMBER); return strcmp(ib_version(), IB_VERSION_STRING) != 0; }\n' > "$T/ver.c"
# shellcheck disable=SC2046
cc -std=c11 -o "$T/ver" "$T/ver.c" $(pkg-config --cflags --libs isobatch) && LD_LIBRARY_PATH=$P/lib "$T/ver" > "$T/ver.out" \
    && [ "$(cut -d' ' -f1 "$T/ver.out")" = "$V" ] && ok || bad "ib_version: $(cat "$T/ver.out" 2>/dev/null)"

# the installed tool: --version, and the default model found from any directory
"$P/bin/isobatch" --version > "$T/v.out" 2>&1 && grep -q "^isobatch $V (library $V)" "$T/v.out" && grep -q "kernels: scalar" "$T/v.out" \
    && ok || bad "isobatch --version: $(cat "$T/v.out")"
if [ -f "$ROOT/models/default/model.safetensors" ]; then
    (cd "$T" && "$P/bin/isobatch" info > "$T/info.out" 2>&1) && grep -q "architecture qwen3" "$T/info.out" \
        && ok || bad "installed isobatch run elsewhere does not find share/isobatch/models/default: $(head -2 "$T/info.out")"
else
    echo "NOTICE: models/default absent: the installed default model was not checked"
fi
(cd "$T" && "$BABS/isobatch" info > "$T/noinfo.out" 2>&1); [ $? = 2 ] && grep -q "no model: pass -m DIR" "$T/noinfo.out" \
    && ok || bad "the uninstalled tool outside the tree: $(cat "$T/noinfo.out")"
finish
