#!/usr/bin/env bash
set -euo pipefail

# System packages: SQLite (GRDB links the system library), zlib, ISA-L (the server's inflate), libcurl (FoundationNetworking's
# URLSession: `dredge` and network logging; its -dev package for `make package`, which links
# Foundation statically), Python 3 with `cryptography` and `jsonschema`
# for the independent protocol check (Tests/interop) and the benchmark's fleet keys, and
# Chromium with its WebDriver and Python's `selenium` for the console's browser test, and
# PostgreSQL (with its contrib extensions: unaccent) for the second back end's tests and demo,
# binutils (`nm`: the test that the agent links neither ISA-L, ZIPFoundation nor the HTTP client),
# Prometheus with promtool (the dashboard and alert rules checked against a real one), and
# systemd's systemd-analyze (the units in docs/systemd/ verified), and mandoc (the package's
# man pages rendered), iproute2 (`ip netns` and `tc`: the polite uploads' shaped link); and
# PyPI's django-oauth-toolkit, the OpenID Connect provider of the single sign-on tests.
packages=(libsqlite3-dev zlib1g-dev libisal-dev libcurl4 libcurl4-openssl-dev chromium chromium-driver postgresql binutils prometheus systemd mandoc iproute2)
command -v python3 >/dev/null || packages+=(python3)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
need_crypto=0
python3 -c "import cryptography, jsonschema, selenium" 2>/dev/null || need_crypto=1

# The OpenID Connect provider the single sign-on tests start on loopback (Tests/sso): PyPI's
# django-oauth-toolkit (Debian's is too old for the device flow), with oauthlib 3: its device
# authorization view fails (500) under oauthlib 4, which answers with a member it does not take.
sso_check="import oauth2_provider, django, oauthlib
v = lambda m: tuple(map(int, m.__version__.split('.')[:2]))
assert v(oauth2_provider) >= (3, 1) and (3, 2) <= v(oauthlib) < (4, 0)"
if ! python3 -c "$sso_check" 2>/dev/null; then
    python3 -m pip install --quiet "django-oauth-toolkit>=3.1,<4" "oauthlib>=3.2.2,<4"
    python3 -c "$sso_check" || { echo "error: python3 cannot import django-oauth-toolkit 3 with oauthlib 3" >&2; exit 1; }
fi

if [ ${#missing[@]} -eq 0 ] && [ $need_crypto -eq 0 ]; then exit 0; fi

echo "installing: ${missing[*]} $([ $need_crypto -eq 1 ] && echo python cryptography jsonschema selenium)" >&2
if [ "$(id -u)" -eq 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null; then
    SUDO="sudo"
else
    echo "error: need root (or sudo) to install ${missing[*]}" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
if [ ${#missing[@]} -gt 0 ]; then
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The python3 on PATH may be Debian's or another install: try pip, then Debian's package.
for module in cryptography jsonschema selenium; do
    if ! python3 -c "import $module" 2>/dev/null; then
        python3 -m pip install --quiet "$module" 2>/dev/null \
            || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "python3-$module"; }
        python3 -c "import $module" || { echo "error: python3 cannot import $module" >&2; exit 1; }
    fi
done
