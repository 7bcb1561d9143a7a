# Shared by scripts/run and scripts/test: a virtualenv that matches pyproject.toml,
# and the local services the tests talk to. Sourced, not run.

PYTHON=${PYTHON:-python3.11}
VENV=${TASKHOOK_VENV:-.venv}

# ensure_venv EXTRAS: create .venv if needed and (re)install the project when
# pyproject.toml changed since the last install or the wanted extras are
# missing (an install with the dev extras also serves the run command).
ensure_venv() {
    local extras=$1
    local stamp="$VENV/.taskhook-installed"
    local project want
    project="$(sha256sum pyproject.toml | cut -d' ' -f1)"
    want="$project [$extras]"
    if [ ! -x "$VENV/bin/python" ]; then
        echo "==> creating $VENV with $($PYTHON --version)"
        "$PYTHON" -m venv "$VENV"
        "$VENV/bin/python" -m pip install --quiet --upgrade pip >"$VENV/pip.log" 2>&1 ||
            { cat "$VENV/pip.log" >&2; return 1; }
    fi
    if [ -z "$extras" ] && [ -f "$stamp" ] && grep -q "^$project " "$stamp"; then
        return 0
    fi
    if [ ! -f "$stamp" ] || ! grep -qxF "$want" "$stamp"; then
        echo "==> installing taskhook${extras:+[$extras]} into $VENV"
        # pip's and setuptools' chatter goes to a log, shown only when it fails.
        "$VENV/bin/python" -m pip install --quiet -e ".${extras:+[$extras]}" >"$VENV/pip.log" 2>&1 ||
            { cat "$VENV/pip.log" >&2; return 1; }
        echo "$want" >"$stamp"
    fi
}

# find_python VERSION: an interpreter of that version (3.12), on the PATH or
# one pyenv installed; nothing and status 1 if there is none.
find_python() {
    local version=$1 candidate
    if "python$version" --version >/dev/null 2>&1; then
        echo "python$version"
        return 0
    fi
    for candidate in "${PYENV_ROOT:-$HOME/.pyenv}/versions/$version".*/bin/"python$version"; do
        if [ -x "$candidate" ]; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

# wait_for DESCRIPTION COMMAND...: retry COMMAND for up to 30 s.
wait_for() {
    local what=$1
    shift
    for _ in $(seq 60); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    echo "!! $what did not come up" >&2
    return 1
}

# Start PostgreSQL and Redis when they are installed here but stopped. A
# service that is not installed is left to the tests, which fail loudly.
start_local_services() {
    if command -v pg_isready >/dev/null && ! pg_isready -q -h 127.0.0.1 -p 5432; then
        if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
            echo "==> starting PostgreSQL"
            pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
            wait_for PostgreSQL pg_isready -q -h 127.0.0.1 -p 5432
        fi
    fi
    if command -v redis-server >/dev/null && ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
        echo "==> starting Redis"
        redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no >/dev/null
        wait_for Redis redis-cli -h 127.0.0.1 -p 6379 ping
    fi
    if command -v rabbitmq-server >/dev/null \
        && ! (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; then
        echo "==> starting RabbitMQ"
        rabbitmq-server -detached >/dev/null 2>&1 || true
        wait_for RabbitMQ rabbitmqctl await_startup
    fi
}

# apt_install WHAT PACKAGE...: install Debian packages, as root or through
# `sudo -n` (never a password prompt). Stale package lists are refreshed once
# per run, when an install first fails. apt's output goes to $VENV/apt.log,
# shown only when the install fails. Without apt-get, nothing is tried.
APT_LISTS_REFRESHED=${APT_LISTS_REFRESHED:-}
apt_install() {
    local what=$1
    shift
    command -v apt-get >/dev/null || return 1
    local sudo="" log="$VENV/apt.log"
    if [ "$(id -u)" -ne 0 ]; then
        sudo="sudo -n"
    fi
    echo "==> installing $what"
    local install=(env DEBIAN_FRONTEND=noninteractive
        apt-get install -y --no-install-recommends "$@")
    $sudo "${install[@]}" >"$log" 2>&1 && return 0
    if [ -z "$APT_LISTS_REFRESHED" ]; then
        APT_LISTS_REFRESHED=1
        { $sudo env DEBIAN_FRONTEND=noninteractive apt-get update && $sudo "${install[@]}"; } \
            >>"$log" 2>&1 && return 0
    fi
    cat "$log" >&2
    return 1
}

# require_commands CONSEQUENCE COMMAND...: say which COMMANDs are still not on
# PATH and what that breaks; in CI (CI=true) a missing one fails the run.
require_commands() {
    local consequence=$1 missing=() command
    shift
    for command in "$@"; do
        command -v "$command" >/dev/null || missing+=("$command")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "!! ${missing[*]} missing; $consequence" >&2
    [ "${CI:-}" != "true" ]
}

# ensure_promtool: promtool (from Debian's prometheus package) checks and
# unit-tests the alerting rules in deploy/prometheus/ (tests/deploy). When it
# is not on PATH, install the package; if that install started a Prometheus
# server (an init system that starts services), stop that one process again:
# nobody asked for a server. In CI (CI=true) a promtool still missing fails.
ensure_promtool() {
    command -v promtool >/dev/null && return 0
    local before pid
    before=" $(pgrep -x prometheus | tr '\n' ' ' || true) "
    apt_install "promtool (Debian's prometheus package)" prometheus || true
    for pid in $(pgrep -x prometheus || true); do
        case "$before" in
        *" $pid "*) ;;
        *)
            echo "==> stopping the Prometheus server the install started (pid $pid)"
            kill "$pid" || true
            ;;
        esac
    done
    require_commands "tests/deploy will fail (apt-get install prometheus)" promtool
}

# ensure_chromium: the console's browser tests (tests/e2e/test_console.py)
# drive Debian's chromium through Playwright, never a browser Playwright
# downloads. When chromium or chromedriver is not on PATH, install both
# packages. In CI (CI=true) either one still missing fails.
ensure_chromium() {
    command -v chromium >/dev/null && command -v chromedriver >/dev/null && return 0
    apt_install "chromium (Debian's chromium and chromium-driver packages)" \
        chromium chromium-driver || true
    require_commands "the console's browser tests will fail (apt-get install chromium chromium-driver)" \
        chromium chromedriver
}

# ensure_kubectl: kubectl renders deploy/kubernetes/ (`kubectl kustomize`,
# its built-in kustomize) for tests/deploy/test_kubernetes.py; no cluster is
# needed or reached. When it is not on PATH, install Debian's
# kubernetes-client package. In CI (CI=true) a kubectl still missing fails.
ensure_kubectl() {
    command -v kubectl >/dev/null && return 0
    apt_install "kubectl (Debian's kubernetes-client package)" kubernetes-client || true
    require_commands "tests/deploy will fail (apt-get install kubernetes-client)" kubectl
}

# ensure_squawk: squawk (npm's squawk-cli, a PostgreSQL migration linter)
# checks the SQL of every migration (python -m migrations.lint, run by
# scripts/test). Installed with npm into the project's own .tools/ (git-
# ignored), pinned; the package brings a prebuilt binary for this platform.
# Without npm, nothing is tried; in CI (CI=true) a squawk still missing fails.
SQUAWK_VERSION=2.66.0
SQUAWK=${TASKHOOK_SQUAWK:-.tools/node_modules/.bin/squawk}
ensure_squawk() {
    if [ -x "$SQUAWK" ] && "$SQUAWK" --version 2>/dev/null | grep -qxF "squawk $SQUAWK_VERSION"; then
        return 0
    fi
    if command -v npm >/dev/null; then
        echo "==> installing squawk $SQUAWK_VERSION into .tools/"
        # Node trusts its own CA list, not the system's: behind a proxy with a
        # local CA (as on this machine) npm needs the system bundle named.
        local bundle=/etc/ssl/certs/ca-certificates.crt
        [ -z "${NODE_EXTRA_CA_CERTS:-}" ] && [ -r "$bundle" ] && export NODE_EXTRA_CA_CERTS=$bundle
        npm install --prefix .tools --no-save --no-audit --no-fund \
            "squawk-cli@$SQUAWK_VERSION" >"$VENV/npm.log" 2>&1 || cat "$VENV/npm.log" >&2
    fi
    if ! "$SQUAWK" --version >/dev/null 2>&1; then
        echo "!! squawk missing; the migration lint will fail (needs npm: apt-get install npm)" >&2
        [ "${CI:-}" != "true" ]
    fi
}

# ensure_pgbouncer: the tests that run taskhook behind PgBouncer in
# transaction mode (tests/support/pgbouncer.py) start their own pgbouncer, on
# a port of their own, and stop it after. When pgbouncer is not installed,
# install Debian's package; if that install started the packaged service (an
# init system that starts services), stop that one process again: nobody asked
# for a server. In CI (CI=true) a pgbouncer still missing fails.
ensure_pgbouncer() {
    # Debian puts it in /usr/sbin, which a user's PATH may leave out.
    if command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ]; then
        return 0
    fi
    local before pid
    before=" $(pgrep -x pgbouncer | tr '\n' ' ' || true) "
    apt_install "pgbouncer (Debian's pgbouncer package)" pgbouncer || true
    for pid in $(pgrep -x pgbouncer || true); do
        case "$before" in
        *" $pid "*) ;;
        *)
            echo "==> stopping the PgBouncer service the install started (pid $pid)"
            kill "$pid" || true
            ;;
        esac
    done
    [ -x /usr/sbin/pgbouncer ] && return 0
    require_commands "the PgBouncer tests will fail (apt-get install pgbouncer)" pgbouncer
}
