#!/usr/bin/env bash
# Build the portable release binaries:
#   dist/<os>-<arch>/executor, dist/<os>-<arch>/executor-client, SHA256SUMS
# (the layout `executor-client bootstrap --from dist` reads).
#
# usage: packaging/build-dist.sh [TARGET]
#   TARGET defaults to x86_64-unknown-linux-gnu.2.17: linked with zig
#   (cargo-zigbuild) against glibc 2.17, so the binaries run on RHEL/CentOS 7
#   and every later glibc distribution. Other targets:
#     aarch64-unknown-linux-gnu.2.17   -> dist/linux-aarch64/
#     x86_64-unknown-linux-musl        -> dist/linux-x86_64/ (static)
#   A target needs its Rust standard library (`rustup target add
#   aarch64-unknown-linux-gnu`, which needs a network that reaches the Rust
#   distribution server); zig brings the C side for every target.
#   On a machine with it:
#     pip install ziglang cargo-zigbuild
#     rustup target add aarch64-unknown-linux-gnu
#     packaging/build-dist.sh aarch64-unknown-linux-gnu.2.17
#   then copy dist/linux-aarch64/ beside dist/linux-x86_64/.
#
# For a glibc target, every dynamic symbol is checked against the glibc
# version the target names (objdump -T): a symbol from a newer glibc fails
# the build. The last line printed is the output directory.
set -euo pipefail
cd "$(dirname "$0")/.."

target=${1:-x86_64-unknown-linux-gnu.2.17}
triple=${target%.[0-9]*.[0-9]*}    # cargo's name: without the glibc suffix
glibc=${target#"$triple"}; glibc=${glibc#.}
case "$triple" in
    x86_64-*-linux-*) platform=linux-x86_64 ;;
    aarch64-*-linux-*) platform=linux-aarch64 ;;
    *) echo "build-dist.sh: no dist name for target $target" >&2; exit 2 ;;
esac
if ! rustup target list --installed 2>/dev/null | grep -qx "$triple" \
    && [ "$triple" != "$(rustc -vV | sed -n 's/^host: //p')" ]; then
    echo "build-dist.sh: the Rust standard library for $triple is not installed (rustup target add $triple)" >&2
    exit 2
fi
if ! command -v cargo-zigbuild >/dev/null 2>&1; then
    echo "build-dist.sh: cargo-zigbuild is missing (pip install ziglang cargo-zigbuild)" >&2
    exit 2
fi

cargo zigbuild --release --locked -p executor-agent -p executor-cli --bins --target "$target"
built="${CARGO_TARGET_DIR:-target}/$triple/release"
out="dist/$platform"
rm -rf "$out"
mkdir -p "$out"
for bin in executor executor-client; do
    install -m 0755 "$built/$bin" "$out/$bin"
done

if [ -n "$glibc" ]; then
    for bin in executor executor-client; do
        # The highest GLIBC_x.y a dynamic symbol of the binary needs.
        need=$(objdump -T "$out/$bin" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n1)
        top=$(printf '%s\n%s\n' "$need" "$glibc" | sort -V | tail -n1)
        if [ "$top" != "$glibc" ]; then
            echo "build-dist.sh: $out/$bin needs GLIBC_$need, above the $glibc of $target:" >&2
            objdump -T "$out/$bin" | grep -E "GLIBC_$need( |$)" >&2
            exit 1
        fi
        echo "$out/$bin: needs at most GLIBC_$need (ceiling $glibc)" >&2
    done
fi
(cd "$out" && sha256sum executor executor-client > SHA256SUMS)
echo "$out"
