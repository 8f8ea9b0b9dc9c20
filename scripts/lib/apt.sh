# Sourced by scripts/setup.sh and scripts/install.sh (bash): Debian packages, installed with
# apt-get only when some are missing (no apt-get update on a machine that has them all).
#
#   apt_ensure PACKAGE...     uses sudo when not root; prints what it does through say()

apt_ensure() {
    local sudo=() missing=() p
    if [ "$(id -u)" -ne 0 ]; then
        sudo=(sudo)
    fi
    for p in "$@"; do
        if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
            missing+=("$p")
        fi
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        say "apt: installing ${missing[*]}"
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
        "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
    else
        say "apt: all $# packages present"
    fi
}
