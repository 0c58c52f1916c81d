#!/usr/bin/env bash
# Compose smoke test: the `docker compose up` demo, for real, on this machine.
#
#   bash scripts/compose-smoke.sh          (as root, or a user of the docker group with an engine)
#
# 1. a Docker engine: Debian's docker.io is installed when there is none, and `dockerd` is
#    started when none runs (and stopped again at the end when this script started it);
# 2. a Compose v2 CLI (see install_compose below for where it comes from);
# 3. the base images the compose file and the Dockerfiles name: pulled, or, when no registry
#    answers, built locally by $FEDREC_BASE_IMAGES_BUILDER (default
#    ../shared/tools/container-standins/build.sh next to the clone) if that exists;
# 4. the project image (classic builder; the CPU torch wheel from pip's find-links folder when
#    it has one, served to a `--network host` build on a loopback port) and the balancer's
#    (Debian's haproxy, deploy/balancer), leaving no dangling image behind;
# 5. `docker compose up` of the demo (its own settings: per-worker partial sums, an evaluation
#    every 10 rounds) with $SMOKE_ROUNDS (30) rounds and a round deadline of
#    $SMOKE_DEADLINE_S (45) s under its own project name and free host ports: every service
#    healthy (the aggregator's $FEDREC_AGGREGATOR_REPLICAS (3) replicas each); once the first
#    round closed, worker-1 stopped with `docker kill` (an operator's stop: Docker does not
#    restart it) and one replica's process killed with SIGKILL (a crash: restarted by Docker);
#    a round closed at its deadline without worker-1's shard, the demo naming the shard and
#    saying the model now differs from an undisturbed run's; `docker compose up -d worker-1`,
#    the worker back; another replica stopped with `docker kill` and brought back with
#    `docker compose up -d`; the last round closed with every update of its cohort; the run
#    finished all the same through the balancer, every replica having answered requests, the
#    demo's top-10 printed, a recommendation answered through a worker and through
#    recommend-api;
#    the dashboard's page and its local assets served, its state showing the run, its user
#    panel answered through a worker, an operator action without the token refused;
# 6. `docker compose down -v` (also on failure): no container, volume (anonymous ones included)
#    or network is left.
#
# Prints each step's time; exits non-zero on the first failure (with the services' logs).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
# The demo's rounds take under a second here: worker-1, killed after round 1, may still have
# sent a few rounds, and the round it misses must not be the last (the last one checks that it
# rejoined); 30 rounds also hold evaluated rounds (10, 20) before the last.
ROUNDS=${SMOKE_ROUNDS:-30}
DEADLINE_S=${SMOKE_DEADLINE_S:-45}
PROJECT=${SMOKE_PROJECT:-fedrecgel-smoke}
IMAGE=fedrecgel:0.1.0
BALANCER_IMAGE=fedrecgel-balancer:0.1.0
BASE_IMAGES=(python:3.11-slim postgres:16 redis:7 debian:bookworm)
export FEDREC_AGGREGATOR_REPLICAS=${FEDREC_AGGREGATOR_REPLICAS:-3}
BUILDER=${FEDREC_BASE_IMAGES_BUILDER:-$ROOT/../shared/tools/container-standins/build.sh}
WORK=$(mktemp -d)
T0=$SECONDS
STEP_T=$SECONDS
STARTED_DOCKERD=
WHEEL_SERVER=
UP=
VOLUMES_BEFORE=

step() {
  echo "== [$((SECONDS - T0))s] $* (previous step took $((SECONDS - STEP_T)) s)"
  STEP_T=$SECONDS
}
fail() {
  echo "FAILED: $*" >&2
  exit 1
}
compose() { docker compose -p "$PROJECT" "$@"; }

cleanup() {
  local rc=$?
  set +e
  if [ -n "$UP" ]; then
    if [ $rc -ne 0 ]; then
      echo "---- services (failure) ----"
      compose ps -a
      compose logs --no-color --tail 60
    fi
    compose down -v --remove-orphans >/dev/null 2>&1
    left=$(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT")
    left+=$(docker volume ls -q --filter "label=com.docker.compose.project=$PROJECT")
    left+=$(comm -13 <(echo "$VOLUMES_BEFORE") <(docker volume ls -q | sort))
    [ -z "$left" ] || { echo "left behind: $left" >&2; rc=1; }
  fi
  [ -z "$WHEEL_SERVER" ] || kill "$WHEEL_SERVER" 2>/dev/null
  if [ -n "$STARTED_DOCKERD" ]; then
    kill "$STARTED_DOCKERD" 2>/dev/null
    for _ in $(seq 30); do kill -0 "$STARTED_DOCKERD" 2>/dev/null || break; sleep 1; done
  fi
  rm -rf "$WORK"
  echo "== compose smoke test $([ $rc -eq 0 ] && echo passed || echo FAILED) in $((SECONDS - T0)) s"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# ---------------------------------------------------------------- 1. engine
step "docker engine"
if ! command -v dockerd >/dev/null 2>&1 && ! docker info >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -q
  as_root apt-get install -y -q --no-install-recommends docker.io
fi
if ! docker info >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || fail "no Docker engine answers and starting one needs root"
  # Debian's docker.io with its default settings (overlay2, bridge network, iptables NAT), but
  # for one: where the machine has no systemd and its processes sit in the root CPU cgroup
  # (cgroup v1, cgroupfs driver), each container gets a cgroup at the top (--cgroup-parent=/)
  # instead of all of them sharing one /docker group. That group weighs as much as ONE process:
  # on a loaded machine all the containers together got the CPU of one process (workers at about
  # a fifth of a core, rounds 3x slower than the same processes outside containers). At the top,
  # each container weighs as much as one process, as each of `fedrec up`'s processes does.
  opts=()
  if [ ! -d /run/systemd/system ] && [ -f /sys/fs/cgroup/cpu/cpu.shares ]; then
    opts+=(--cgroup-parent=/)
  fi
  dockerd "${opts[@]}" >"$WORK/dockerd.log" 2>&1 &
  STARTED_DOCKERD=$!
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { tail -20 "$WORK/dockerd.log"; fail "dockerd did not start"; }
fi
docker version --format 'engine {{.Server.Version}}, client {{.Client.Version}}'
cpu_cgroup() { awk -F: '$2 ~ /(^|,)cpu(,|$)/ {print $3; exit}' "/proc/$1/cgroup"; }

# ---------------------------------------------------------------- 2. compose v2
# Where Compose v2 comes from when the machine has none: Debian's own `docker-compose` package
# of the next release (trixie: Compose 2.x, built by Debian from the upstream Go sources; its
# only dependency is libc6 >= 2.34, which bookworm has). Why it is trusted: apt downloads it
# over a separate, throw-away apt state (nothing is added to the system's sources) and checks
# the release file's signature against the Debian archive keyring the system already trusts
# (bookworm's debian-archive-keyring carries the trixie keys) and the package's SHA-256 against
# that signed index; only the plugin binary is then copied out of the .deb. Bookworm's own
# docker-compose is v1 (1.29), which rejects this compose file's top-level `name:`.
install_compose() {
  local apt_dir="$WORK/apt" suite=${COMPOSE_DEBIAN_SUITE:-trixie} mirror deb
  mirror=$(grep -h -m1 -E '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' | head -1)
  [ -n "$mirror" ] || mirror=$(grep -h -m1 -E '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}')
  [ -n "$mirror" ] || mirror=http://deb.debian.org/debian
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/parts" "$apt_dir/deb"
  printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$mirror" "$suite" >"$apt_dir/parts/compose.sources"
  local opts=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$apt_dir/parts"
    -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
    -o "APT::Sandbox::User=root" -o "Debug::NoLocking=1")
  apt-get -q "${opts[@]}" update >/dev/null
  (cd "$apt_dir/deb" && apt-get -q "${opts[@]}" download docker-compose >/dev/null)
  deb=$(ls "$apt_dir"/deb/docker-compose_*.deb)
  dpkg-deb -x "$deb" "$apt_dir/x"
  as_root install -D -m 0755 "$apt_dir/x/usr/libexec/docker/cli-plugins/docker-compose" \
    /usr/local/lib/docker/cli-plugins/docker-compose
  echo "installed Compose from $(basename "$deb")"
}
step "compose v2"
major=$(docker compose version --short 2>/dev/null | sed -E 's/^v?([0-9]+).*/\1/' || true)
if [ -z "$major" ] || [ "$major" -lt 2 ]; then
  install_compose
fi
docker compose version

# ---------------------------------------------------------------- 3. base images
step "base images"
missing=()
for img in "${BASE_IMAGES[@]}"; do
  docker image inspect "$img" >/dev/null 2>&1 && continue
  if ! docker pull -q "$img" >/dev/null 2>&1; then missing+=("$img"); fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "cannot pull ${missing[*]}; building them locally with $BUILDER"
  [ -x "$BUILDER" ] || fail "no registry answers and no base image builder at $BUILDER"
  bash "$BUILDER"
fi
for img in "${BASE_IMAGES[@]}"; do docker image inspect "$img" >/dev/null 2>&1 || fail "no image $img"; done

# ---------------------------------------------------------------- 4. project image
step "project image"
build_args=()
links=$(python3 -m pip config list 2>/dev/null | sed -nE "s/^[a-z:.]*find-links='([^']*)'.*/\1/p" | head -1 || true)
if [ -n "$links" ] && ls "$links"/torch-2.13.0+cpu-*.whl >/dev/null 2>&1; then
  # the same port from one run to the next when it is free: the URL is a build argument, part
  # of the cache key of the torch layer (a new port would reinstall torch)
  port=$(python3 -c '
import socket
for p in range(18999, 19100):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", p))
        except OSError:
            continue
        print(p)
        break')
  python3 -m http.server --bind 127.0.0.1 "$port" --directory "$links" >/dev/null 2>&1 &
  WHEEL_SERVER=$!
  for _ in $(seq 20); do python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/')" 2>/dev/null && break; sleep 0.5; done
  build_args+=(--network host --build-arg "TORCH_FIND_LINKS=http://127.0.0.1:$port/")
  echo "torch wheel from $links"
fi
# what a build may leave dangling: the images these tags named before (replaced by the build)
dangling_before=$(docker images -q -f dangling=true | sort -u)
replaced=$(docker image inspect -f '{{.Id}}' "$IMAGE" "$BALANCER_IMAGE" 2>/dev/null | cut -c8-19 || true)
DOCKER_BUILDKIT=0 docker build -q "${build_args[@]}" -f deploy/Dockerfile -t "$IMAGE" . >/dev/null
[ -z "$WHEEL_SERVER" ] || { kill "$WHEEL_SERVER" 2>/dev/null; WHEEL_SERVER=; }
docker image ls "$IMAGE" --format '{{.Repository}}:{{.Tag}} {{.Size}}'
DOCKER_BUILDKIT=0 docker build -q -f deploy/balancer/Dockerfile -t "$BALANCER_IMAGE" deploy >/dev/null
docker image ls "$BALANCER_IMAGE" --format '{{.Repository}}:{{.Tag}} {{.Size}}'
# no untagged stage image (deploy/Dockerfile has one stage): nothing dangling but what was
new_dangling=$(comm -13 <(echo "$dangling_before") <(docker images -q -f dangling=true | sort -u) |
  grep -vxF -f <(echo "${replaced:-none}") || true)
[ -z "$new_dangling" ] || fail "the build left dangling images: $new_dangling"
# the images the tags named before the build, now untagged: removed unless a container uses one
for old in $replaced; do
  if docker images -q -f dangling=true | grep -qx "$old"; then
    docker image rm "$old" >/dev/null 2>&1 && echo "removed the replaced image $old" ||
      echo "kept the replaced image $old (a container uses it)"
  fi
done
echo "no dangling image left by the build"

# ---------------------------------------------------------------- 5. the demo
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
export FEDREC_AGGREGATOR_PORT=$(free_port) FEDREC_RECOMMEND_PORT=$(free_port)
export FEDREC_WORKER0_PORT=$(free_port) FEDREC_WORKER1_PORT=$(free_port)
export FEDREC_DASHBOARD_PORT=$(free_port)
export FEDREC_DEMO_ROUNDS=$ROUNDS FEDREC_DEMO_DEADLINE_S=$DEADLINE_S
agg=http://127.0.0.1:$FEDREC_AGGREGATOR_PORT

py_get() {  # URL [python expression over the JSON body `b`] [bearer token]: print it, fail on non-2xx
  python3 - "$1" "${2:-b}" "${3:-}" <<'EOF'
import json, sys, urllib.request
headers = {"Authorization": f"Bearer {sys.argv[3]}"} if sys.argv[3] else {}
with urllib.request.urlopen(urllib.request.Request(sys.argv[1], headers=headers), timeout=30) as r:
    b = json.loads(r.read())
print(eval(sys.argv[2], {"b": b}))
EOF
}
closed_rounds() { py_get "$agg/v1/runs/current/history" 'len(b["rounds"])' 2>/dev/null || echo 0; }

step "docker compose up (demo of $ROUNDS rounds)"
compose down -v --remove-orphans >/dev/null 2>&1 || true
# every volume of the engine before the up: the same after `down -v` (no anonymous one left)
VOLUMES_BEFORE=$(docker volume ls -q | sort)
UP=1
UP_T=$SECONDS
compose up -d --no-build --quiet-pull
step "every service healthy"
# the health of every container of a service, one word each (the replicas: several)
health_of() {
  local id
  for id in $(compose ps -q "$1"); do docker inspect -f '{{.State.Health.Status}}' "$id"; done | sort | uniq -c | awk '{printf "%s%s x%s", (NR > 1 ? " " : ""), $2, $1}'
}
want_of() { [ "$1" = aggregator-replica ] && echo "healthy x$FEDREC_AGGREGATOR_REPLICAS" || echo "healthy x1"; }
SERVICES=(postgres redis aggregator-replica aggregator worker-0 worker-1 recommend-api dashboard)
for svc in "${SERVICES[@]}"; do
  # `up` waited for the ones the demo depends on; recommend-api may still be starting
  for _ in $(seq 120); do [ "$(health_of "$svc")" = "$(want_of "$svc")" ] && break; sleep 1; done
  [ "$(health_of "$svc")" = "$(want_of "$svc")" ] || fail "$svc is $(health_of "$svc")"
done
echo "${SERVICES[*]}: healthy ($FEDREC_AGGREGATOR_REPLICAS replicas)"
replicas=($(compose ps -q aggregator-replica))
echo "an aggregator replica's CPU cgroup: $(cpu_cgroup "$(docker inspect -f '{{.State.Pid}}' "${replicas[0]}")")"
[ "$(docker inspect -f '{{.State.ExitCode}}' "$(compose ps -aq secrets)")" = 0 ] || fail "secrets failed"

step "first round"
for _ in $(seq 600); do [ "$(closed_rounds)" -ge 1 ] && break; sleep 0.5; done
[ "$(closed_rounds)" -ge 1 ] || fail "no round closed"
echo "first round closed $((SECONDS - UP_T)) s after docker compose up"

# An operator's stop of a worker: `docker kill`. Docker applies no restart policy after it, so
# worker-1 stays down; its shard's clients (about half of each cohort) stop uploading and the
# demo's quorum (0.3) closes rounds at their deadline without them.
step "docker kill worker-1 (an operator's stop)"
worker1=$(compose ps -q worker-1)
worker1_restarts=$(docker inspect -f '{{.RestartCount}}' "$worker1")
docker kill "$worker1" >/dev/null
KILLED_AT=$(closed_rounds)

# A crash of the aggregator: SIGKILL to its process. Not `docker kill -s KILL`: the engine takes
# that as an operator's stop and applies no restart policy after it (Debian's engine 20.10,
# checked with always, on-failure and unless-stopped: the container stays exited). A process
# that dies by itself (killed by the kernel's OOM killer, a crash) is what the policy restarts.
step "SIGKILL an aggregator replica's process"
agg_id=${replicas[0]}
restarts=$(docker inspect -f '{{.RestartCount}}' "$agg_id")
as_root kill -KILL "$(docker inspect -f '{{.State.Pid}}' "$agg_id")"
for _ in $(seq 120); do
  [ "$(docker inspect -f '{{.RestartCount}} {{.State.Health.Status}}' "$agg_id")" = "$((restarts + 1)) healthy" ] && break
  sleep 1
done
state=$(docker inspect -f '{{.RestartCount}} {{.State.Health.Status}}' "$agg_id")
[ "$state" = "$((restarts + 1)) healthy" ] || fail "the replica after the kill: restarts/health $state"
echo "the replica restarted by Docker and healthy again ($state)"

step "a round closes without worker-1's shard"
[ "$(docker inspect -f '{{.State.Status}} {{.RestartCount}}' "$worker1")" = "exited $worker1_restarts" ] ||
  fail "worker-1 after docker kill: $(docker inspect -f '{{.State.Status}} restarts {{.RestartCount}}' "$worker1")"
echo "worker-1 stays exited after docker kill (no restart policy applies)"
without_shard1() {  # the closed rounds after $KILLED_AT that closed without shard 1's clients
  local r
  for r in $(seq $((KILLED_AT + 1)) "$(closed_rounds)"); do
    py_get "$agg/v1/rounds/$r" '"1/2" in b["missing_by_shard"] and b["state"] == "closed"' |
      grep -q True && echo "$r"
  done
}
for _ in $(seq $((DEADLINE_S * 3))); do [ -n "$(without_shard1)" ] && break; sleep 1; done
[ -n "$(without_shard1)" ] || fail "no round closed without worker-1's shard"
echo "round(s) closed without shard 1: $(without_shard1 | tr '\n' ' ')"
[ "$(without_shard1 | tail -1)" -lt "$ROUNDS" ] ||
  fail "the last round closed without shard 1: nothing left to show it rejoins (SMOKE_ROUNDS=$ROUNDS)"
demo_log() { docker logs "$(compose ps -aq demo)" 2>&1; }
demo_log | grep -E "not uploaded: shard 1 of 2 \(http://worker-1:8710\): does not answer" ||
  fail "the demo did not name the missing shard"
for _ in $(seq 20); do demo_log | grep -q "differs from an undisturbed run's" && break; sleep 1; done
demo_log | grep "differs from an undisturbed run's" || fail "the demo did not say the model differs"

step "docker compose up -d worker-1: it rejoins"
compose up -d --no-build worker-1 2>&1 | tail -2
for _ in $(seq 120); do [ "$(health_of worker-1)" = "healthy x1" ] && break; sleep 1; done
[ "$(health_of worker-1)" = "healthy x1" ] || fail "worker-1 is $(health_of worker-1) after up -d"
echo "worker-1 healthy again"

# An operator's stop of an aggregator replica: `docker kill` of its container (no restart policy
# applies, as for worker-1). The balancer takes it out; the workers' requests that were in it
# are retried on the others; `docker compose up -d` brings it back.
step "docker kill an aggregator replica (an operator's stop), then docker compose up -d"
agg_stopped=${replicas[1]}
docker kill "$agg_stopped" >/dev/null
sleep 2
[ "$(docker inspect -f '{{.State.Status}}' "$agg_stopped")" = exited ] ||
  fail "the replica after docker kill: $(docker inspect -f '{{.State.Status}}' "$agg_stopped")"
echo "the replica stays exited after docker kill"
compose up -d --no-build aggregator-replica 2>&1 | tail -2
for _ in $(seq 120); do
  [ "$(docker inspect -f '{{.State.Status}} {{.State.Health.Status}}' "$agg_stopped")" = "running healthy" ] && break
  sleep 1
done
[ "$(docker inspect -f '{{.State.Status}} {{.State.Health.Status}}' "$agg_stopped")" = "running healthy" ] ||
  fail "the replica after up -d: $(docker inspect -f '{{.State.Status}} {{.State.Health.Status}}' "$agg_stopped")"
[ "$(compose ps -q aggregator-replica | wc -l)" = "$FEDREC_AGGREGATOR_REPLICAS" ] ||
  fail "up -d did not keep $FEDREC_AGGREGATOR_REPLICAS replicas: $(compose ps -q aggregator-replica | wc -l)"
echo "the replica is running and healthy again (the same container)"

step "the run goes on to the end"
compose wait demo >/dev/null 2>&1 || true
code=$(docker inspect -f '{{.State.ExitCode}}' "$(compose ps -aq demo)")
docker logs "$(compose ps -aq demo)" 2>&1 | tee "$WORK/demo.log"
[ "$code" = 0 ] || fail "the demo exited with $code"
grep -q "run [0-9]*: $ROUNDS rounds closed and evaluated" "$WORK/demo.log" || fail "the run did not finish"
grep -qF "dashboard: http://127.0.0.1:$FEDREC_DASHBOARD_PORT/ui/" "$WORK/demo.log" || fail "the demo did not print the dashboard's address"
[ "$(grep -cE '^ +[0-9]+  ' "$WORK/demo.log")" -ge 10 ] || fail "no top-10 in the demo's log"
grep -qE "^round $ROUNDS HR@10 [0-9.]+  NDCG@10 [0-9.]+; popularity \(each item's count of users\) on the same candidates: HR@10" \
  "$WORK/demo.log" || fail "the demo did not compare its last round with popularity"
# the rounds the demo's run evaluates (every 10th and the last) have metrics, no other
evaluated=$(for r in $(seq 1 "$ROUNDS"); do
  py_get "$agg/v1/rounds/$r" 'bool(b["metrics"])' | grep -q True && echo -n "$r "
done)
echo "evaluated rounds: $evaluated"
want=$(for r in $(seq 1 "$ROUNDS"); do { [ $((r % 10)) = 0 ] || [ "$r" = "$ROUNDS" ]; } && echo -n "$r "; done)
[ "$evaluated" = "$want" ] || fail "rounds evaluated: $evaluated; the run evaluates $want"
[ "$(closed_rounds)" = "$ROUNDS" ] || fail "$(closed_rounds) rounds closed, not $ROUNDS"
# worker-1 rejoined: the last round took every update of its cohort
last=$(py_get "$agg/v1/rounds/$ROUNDS" '(b["state"], b["updates_received"] == b["cohort_size"], b["missing_by_shard"])')
echo "round $ROUNDS: $last"
[ "$last" = "('closed', True, {})" ] || fail "the last round did not close with worker-1's shard"
# the balancer spread the run over every replica (their access logs), each round closed once
closes=0
for id in "${replicas[@]}"; do
  name=$(docker inspect -f '{{.Name}}' "$id")
  served=$(docker logs "$id" 2>&1 | grep -cE '"(GET|POST) /v1/' || true)
  closed=$(docker logs "$id" 2>&1 | grep -oE 'round [0-9]+ closed' | tr '\n' ' ' || true)
  echo "$name: $served requests; ${closed:-no round closed}"
  [ "$served" -gt 0 ] || fail "$name answered no request through the balancer"
  closes=$((closes + $(docker logs "$id" 2>&1 | grep -cE 'round [0-9]+ closed' || true)))
done
[ "$closes" = "$ROUNDS" ] || fail "$closes round closes logged by the replicas, not $ROUNDS"
# what the balancer saw of the kill, and what the workers had to retry
docker logs -t "$(compose ps -q aggregator)" 2>&1 | grep -E 'Server [^ ]+ is (UP|DOWN)' |
  sed -E 's/^([^ ]+) .*Server ([^ ]+) is (UP|DOWN).*/balancer: \1 \2 \3/' || true
echo "worker requests retried: $(compose logs --no-color worker-0 worker-1 2>&1 | grep -c 'retry [0-9]' || true)"

step "recommendations through a worker and through recommend-api"
# the device API's bearer token, as the secrets service generated it
device_token=$(compose exec -T worker-1 cat /run/fedrec-secrets/device_token)
py_get "http://127.0.0.1:$FEDREC_WORKER1_PORT/v1/users/1/recommendations?k=10" \
  '(b["model_version"], len(b["items"]))' "$device_token" | tee "$WORK/worker.txt"
grep -qE "^\($ROUNDS, 10\)$" "$WORK/worker.txt" || fail "worker-1 did not answer 10 items of v$ROUNDS"
python3 - "http://127.0.0.1:$FEDREC_RECOMMEND_PORT/v1/recommendations" "$ROUNDS" <<'EOF'
import json, sys, urllib.request
body = {"user": {"user_gmf": [0.1] * 32, "user_mlp": [0.1] * 128}, "k": 10, "exclude": ["1"]}
req = urllib.request.Request(sys.argv[1], json.dumps(body).encode(), {"Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=30) as r:
    b = json.loads(r.read())
items = [it["item"] for it in b["items"]]
print("recommend-api:", b["model_version"], items)
assert b["model_version"] == int(sys.argv[2]) and len(items) == 10 and "1" not in items, b
EOF
step "the dashboard"
dash=http://127.0.0.1:$FEDREC_DASHBOARD_PORT
python3 - "$dash" "$agg" <<'EOF'
import re, sys, urllib.request
dash, agg = sys.argv[1], sys.argv[2]
def get(url):
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read()
page = get(f"{dash}/ui/").decode()
assert "FedRecGEL federation" in page, page[:300]
# every script, style sheet and icon of the page and of each /docs is served locally (no CDN)
for base, html in ((dash, page), (dash, get(f"{dash}/docs").decode()), (agg, get(f"{agg}/docs").decode())):
    for url in re.findall(r"(?:src|href)=['\"](/[^'\"]+)['\"]", html):
        get(base + url)
print("dashboard page, chart library and Swagger UI assets: served locally")
EOF
py_get "$dash/ui/api/state" '(len(b["history"]), [w["ok"] for w in b["workers"]], b["recommend"]["model_version"])' \
  | tee "$WORK/dashboard.txt"
grep -qE "^\($ROUNDS, \[True, True\], $ROUNDS\)$" "$WORK/dashboard.txt" || fail "the dashboard does not show the run"
# the user panel reaches the worker of the user's shard with the device token
py_get "$dash/ui/api/users/1/recommendations?k=10" '(b["model_version"], len(b["items"]))' \
  | tee "$WORK/dashboard-user.txt"
grep -qE "^\($ROUNDS, 10\)$" "$WORK/dashboard-user.txt" || fail "the dashboard's user panel failed"
# an operator action without the operator token is refused
code=$(python3 -c 'import sys, urllib.request as u, urllib.error as e
try: u.urlopen(u.Request(sys.argv[1], b"", method="POST"), timeout=30); print(200)
except e.HTTPError as err: print(err.code)' "$dash/ui/api/runs/current/stop")
[ "$code" = 401 ] || fail "an operator action without the token answered $code, not 401"
for svc in aggregator-replica aggregator worker-0 worker-1 recommend-api dashboard; do
  [ "$(health_of "$svc")" = "$(want_of "$svc")" ] || fail "$svc not healthy after the run: $(health_of "$svc")"
done

step "docker compose down -v"
compose down -v --remove-orphans
UP=
left=$(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT")
left+=$(docker volume ls -q --filter "label=com.docker.compose.project=$PROJECT")
left+=$(comm -13 <(echo "$VOLUMES_BEFORE") <(docker volume ls -q | sort))
[ -z "$left" ] || fail "left behind: $left"
echo "no container or volume left (anonymous volumes included)"
step "done"
