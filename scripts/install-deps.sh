#!/usr/bin/env bash
# Installs the Debian packages the project builds and runs with, if any is missing.
set -euo pipefail
packages=(libzmq3-dev libsqlite3-dev libvips-dev libjpeg-dev pkg-config curl gcc python3 iproute2 ffmpeg gdb)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq "${missing[@]}" >/dev/null
