#!/bin/sh
# build-kernel.sh: builds the appliance bzImage from Debian's linux-source-6.12 and the fragments here.
# Usage: build-kernel.sh OUT_DIR WORK_DIR FRAGMENT...
# Writes OUT_DIR/bzImage, OUT_DIR/config and OUT_DIR/version only when every requested option
# survived olddefconfig and the bzImage is within its size budget. Called by `cargo xtask image`
# (xtask/src/kernel.rs), which hashes this script, the fragments and the source version into
# OUT_DIR's name.
set -eu
out=$1; work=$2; shift 2
[ $# -gt 0 ] || { echo "build-kernel.sh: no fragments given" >&2; exit 2; }
pkg=linux-source-6.12
tarball=/usr/src/$pkg.tar.xz
if [ ! -f "$tarball" ] || ! command -v bc >/dev/null || ! command -v flex >/dev/null || ! command -v bison >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
        apt-get install -y $pkg bc flex bison libelf-dev libssl-dev
    else
        echo "build-kernel.sh: $tarball or build tools missing; as root run: apt-get install -y $pkg bc flex bison libelf-dev libssl-dev" >&2
        exit 1
    fi
fi
version=$(dpkg-query -W -f '${Version}' $pkg)
src=$work/$pkg-$version
if [ ! -f "$src/Makefile" ]; then
    echo "build-kernel.sh: unpacking $tarball ($pkg $version)"
    rm -rf "$src.tmp"; mkdir -p "$src.tmp"
    tar -C "$src.tmp" -xf "$tarball"
    mv "$src.tmp/$pkg" "$src"; rmdir "$src.tmp"
fi
build=$out.build
rm -rf "$build"; mkdir -p "$build"
make -s -C "$src" O="$build" tinyconfig
"$src/scripts/kconfig/merge_config.sh" -m -O "$build" "$build/.config" "$@" >"$build/merge.log"
make -s -C "$src" O="$build" olddefconfig
# Every option the fragments ask for must be in the final configuration.
missing=$(cat "$@" | grep -E '^(CONFIG_[A-Za-z0-9_]+=|# CONFIG_[A-Za-z0-9_]+ is not set)' | sort -u | while IFS= read -r want; do
    case $want in
        "# "*) sym=${want#\# }; sym=${sym%% *}
               if grep -q "^$sym=" "$build/.config"; then echo "  $want (final: $(grep "^$sym=" "$build/.config"))"; fi ;;
        *) grep -qxF "$want" "$build/.config" || { sym=${want%%=*}; echo "  $want (final: $(grep -E "^$sym=|^# $sym is not set" "$build/.config" || echo absent))"; } ;;
    esac
done)
if [ -n "$missing" ]; then
    echo "build-kernel.sh: these options did not survive olddefconfig:" >&2
    echo "$missing" >&2
    exit 1
fi
echo "build-kernel.sh: configuration verified; make -j$(nproc) bzImage"
make -C "$src" O="$build" -j"$(nproc)" bzImage
# The size budget (ADR-0005): every built-in driver is loaded on every boot (PXE over TFTP, each
# A/B slot's UKI on the ESP, decompression). Raising it is a decision for the ADR, not only here.
budget=$((4608 * 1024))
size=$(stat -c %s "$build/arch/x86/boot/bzImage")
if [ "$size" -gt "$budget" ]; then
    echo "build-kernel.sh: bzImage is $size bytes, over the budget of $budget bytes (4.5 MiB, ADR-0005)" >&2
    exit 1
fi
echo "build-kernel.sh: bzImage $size bytes (budget $budget)"
mkdir -p "$out"
cp "$build/arch/x86/boot/bzImage" "$out/bzImage.tmp"
cp "$build/.config" "$out/config"
echo "$pkg $version $(make -s -C "$src" O="$build" kernelrelease)" >"$out/version"
mv "$out/bzImage.tmp" "$out/bzImage"
rm -rf "$build"
echo "build-kernel.sh: done: $out/bzImage"
