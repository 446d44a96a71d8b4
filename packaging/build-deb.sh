#!/usr/bin/env bash
# Build the Debian package: target/debian/executor_<version>_<arch>.deb
# holding executor and executor-client, their man pages
# and shell completions, the example configuration (all commented out, as
# the conffile /etc/executor/config.toml), and the sshd / authorized_keys
# examples.
#
# usage: packaging/build-deb.sh [DIST_DIR]
#   DIST_DIR: the portable binaries of packaging/build-dist.sh
#   (dist/linux-x86_64); without it, build-dist.sh is run first. The
#   package holds exactly those binaries (glibc 2.17 and later).
set -euo pipefail
cd "$(dirname "$0")/.."

bins=${1:-}
if [ -z "$bins" ]; then
    bins=$(packaging/build-dist.sh | tail -n1)
fi
case "$(basename "$bins")" in
    linux-x86_64) arch=amd64 ;;
    linux-aarch64) arch=arm64 ;;
    *) echo "build-deb.sh: $bins is not a dist/linux-<arch> folder" >&2; exit 2 ;;
esac
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
out=target/debian
stage="$out/executor_${version}_${arch}"
rm -rf "$stage"
install -d "$stage/DEBIAN" "$stage/usr/bin" "$stage/usr/share/man/man1" \
    "$stage/usr/share/bash-completion/completions" \
    "$stage/usr/share/zsh/vendor-completions" \
    "$stage/usr/share/fish/vendor_completions.d" \
    "$stage/usr/share/doc/executor/examples" "$stage/etc/executor"

for bin in executor executor-client; do
    install -m 0755 "$bins/$bin" "$stage/usr/bin/$bin"
done
gen() { # gen BIN KIND: the binary prints its own man page or completions
    if [ "$1" = executor ]; then "$bins/$1" --generate "$2"; else "$bins/$1" generate "$2"; fi
}
for bin in executor executor-client; do
    gen "$bin" man | gzip -9n > "$stage/usr/share/man/man1/$bin.1.gz"
    gen "$bin" bash > "$stage/usr/share/bash-completion/completions/$bin"
    gen "$bin" zsh > "$stage/usr/share/zsh/vendor-completions/_$bin"
    gen "$bin" fish > "$stage/usr/share/fish/vendor_completions.d/$bin.fish"
done
install -m 0644 packaging/config.toml "$stage/etc/executor/config.toml"
install -m 0644 packaging/config.toml "$stage/usr/share/doc/executor/examples/config.toml"
install -m 0644 packaging/sshd_config.d-executor.conf \
    "$stage/usr/share/doc/executor/examples/sshd_config.d-executor.conf"
install -m 0644 packaging/authorized_keys.example \
    "$stage/usr/share/doc/executor/examples/authorized_keys.example"
install -m 0644 README.md "$stage/usr/share/doc/executor/README.md"

size=$(du -k -s "$stage" | cut -f1)
cat > "$stage/DEBIAN/control" <<CONTROL
Package: executor
Version: $version
Architecture: $arch
Maintainer: executor maintainers <executor@example.invalid>
Installed-Size: $size
Depends: libc6 (>= 2.17)
Recommends: openssh-server
Section: admin
Priority: optional
Homepage: https://example.invalid/executor
Description: hardened agent that runs commands, files and HTTP for an orchestrator
 executor runs on a remote host over the SSH connection's stdin/stdout
 (ssh devbox executor): processes with pipes or a PTY, the unified-exec tool
 contract, bounded filesystem access, HTTP from the host's network, and a
 sandbox (Landlock, seccomp, mount namespaces) enforced on the host.
 executor-client drives it from the orchestrator's side.
CONTROL
echo /etc/executor/config.toml > "$stage/DEBIAN/conffiles"
dpkg-deb --root-owner-group --build "$stage" "$out/" >/dev/null
deb="$out/executor_${version}_${arch}.deb"
echo "$deb"
