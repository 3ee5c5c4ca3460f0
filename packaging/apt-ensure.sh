# Sourced by dev.sh and packaging/build-*.sh: install the Debian packages that are missing.
#
#   apt_ensure WHO [--no-install-recommends] PACKAGE...
#
# Installed packages are left alone; missing ones are installed with apt-get when running as
# root, otherwise WHO (the calling script's name, for the message) exits 1 naming them.
apt_ensure() {
    local who=$1 p
    shift
    local opts=()
    if [ "${1:-}" = --no-install-recommends ]; then
        opts+=(--no-install-recommends)
        shift
    fi
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" -ne 0 ]; then
        echo "$who: missing Debian packages: ${missing[*]} (run as root, or install them)" >&2
        exit 1
    fi
    echo "$who: installing ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${opts[@]}" "${missing[@]}" >/dev/null
}
