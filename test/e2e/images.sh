#!/usr/bin/env bash
# Builds the images the real-cluster suite (test/e2e) runs, on a kcluster machine (root, Debian
# bookworm; see ../shared/tools/kcluster/README.md), and prints the suite's image variables as
# `export` lines on stdout (progress goes to stderr):
#
#   eval "$(test/e2e/images.sh)"
#
# - SANDPOD_E2E_IMAGE: the executor image (`kcluster image python`, the project's joined runner as
#   /sandpod/runner.py), imported into the node's containerd;
# - SANDPOD_E2E_DATA_IMAGE: the same with Debian's python3-numpy and python3-pandas (the `data` job
#   type's image), imported too;
# - SANDPOD_E2E_BUILT_IMAGE: that data image pushed to `kcluster registry` (127.0.0.1:5000), pinned by
#   digest, as a built job type's image is;
# - SANDPOD_E2E_SERVICE_IMAGE: the service image as the repository's Dockerfile describes it (node +
#   dist/ from `npm run build` + production node_modules, uid 1000, `node dist/main.js`), pushed to
#   the registry and pinned by digest.
#
# The Debian root filesystems (bookworm minbase, with and without python3 and the scientific stack)
# are made once with debootstrap and cached under $SANDPOD_E2E_ROOTFS_CACHE (default
# /var/tmp/sandpod-e2e-rootfs); delete a directory there to rebuild it. Needs the registry up
# (`kcluster registry up`). Env: KCLUSTER (default: `kcluster` on PATH, else a kcluster checkout next
# to the repository), TAG (default e2e).
set -euo pipefail

cd "$(dirname "$0")/../.."
REPO=$PWD
K=${KCLUSTER:-$(command -v kcluster || echo "$REPO/../shared/tools/kcluster/kcluster")}
TAG=${TAG:-e2e}
CACHE=${SANDPOD_E2E_ROOTFS_CACHE:-/var/tmp/sandpod-e2e-rootfs}
REGISTRY=127.0.0.1:5000
[ -x "$K" ] || { echo "images.sh: kcluster not found at $K (set KCLUSTER)" >&2; exit 2; }
eval "$("$K" env)" # KUBECONFIG, KCLUSTER_HOME
log() { echo "[images $(date -u +%H:%M:%S)] $*" >&2; }

W=$(mktemp -d /var/tmp/sandpod-e2e-images.XXXXXX)
trap 'rm -rf "$W"' EXIT

mirror() {
  if [ -n "${KCLUSTER_DEBIAN_MIRROR:-}" ]; then echo "$KCLUSTER_DEBIAN_MIRROR"; return; fi
  apt-get indextargets --format '$(REPO_URI) $(CODENAME) $(TARGET_OF) $(COMPONENT)' 'Identifier: Packages' |
    awk '$2 == "bookworm" && $3 == "deb" && $4 == "main" { print $1; exit }'
}

# rootfs NAME PACKAGES: a cached debootstrap of bookworm minbase with PACKAGES (comma-separated).
rootfs() {
  local dir=$CACHE/$1 pkgs=$2
  if [ ! -f "$dir.done" ]; then
    log "debootstrap bookworm minbase + ${pkgs:-nothing} into $dir (once; log $dir.log)"
    rm -rf "$dir.tmp" "$dir"
    mkdir -p "$CACHE"
    debootstrap --variant=minbase ${pkgs:+--include=$pkgs} bookworm "$dir.tmp" "$(mirror)" >"$dir.log" 2>&1 ||
      { echo "images.sh: debootstrap failed, see $dir.log" >&2; exit 1; }
    # debootstrap may leave its /proc and /sys mounts behind.
    findmnt -rn -o TARGET | awk -v p="$(readlink -f "$dir.tmp")/" 'index($0, p) == 1' | sort -r | while read -r m; do umount -l "$m" || true; done
    rm -rf "$dir.tmp"/proc/* "$dir.tmp"/sys/* "$dir.tmp"/dev/* "$dir.tmp"/run/* "$dir.tmp"/tmp/* "$dir.tmp"/var/tmp/*
    rm -rf "$dir.tmp"/var/cache/apt/archives/*.deb "$dir.tmp"/var/lib/apt/lists/*
    : >"$dir.tmp/etc/resolv.conf"
    chmod 1777 "$dir.tmp/tmp"
    mv "$dir.tmp" "$dir"
    touch "$dir.done"
  fi
  echo "$dir"
}

# push ARCHIVE NAME:TAG: copies a kcluster image archive to the registry; the reference by digest.
push() {
  skopeo copy --quiet --dest-tls-verify=false --digestfile "$W/digest" "docker-archive:$1" "docker://$REGISTRY/$2" >&2
  echo "$REGISTRY/$2@$(cat "$W/digest")"
}
archive() { echo "$KCLUSTER_HOME/images/archives/$(echo "$1" | tr '/:@' '___').tar"; }

# (a) The executor image: kcluster's Debian python3 image with the joined runner.
log "executor image sandpod.local/executor:$TAG"
node --import tsx src/sandbox/write-runner.ts "$W/runner.py"
"$K" image python "sandpod.local/executor:$TAG" --runner "$W/runner.py" >&2

# (b) The data executor image: the same layout (src/sandbox/Dockerfile) on a rootfs with Debian's
# numpy and pandas.
log "data executor image sandpod.local/executor-data:$TAG"
DATA_BASE=$(rootfs bookworm-python3-data python3,python3-pip,python3-venv,python3-numpy,python3-pandas)
R=$W/data
cp -a "$DATA_BASE" "$R"
groupadd -R "$R" --gid 1000 sandbox
useradd -R "$R" --uid 1000 --gid 1000 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin sandbox
mkdir -p "$R"/{sandpod,code,input,output,deps,control}
chown 1000:1000 "$R/output" "$R/deps" "$R/control"
install -m 0644 -o 0 -g 0 "$W/runner.py" "$R/sandpod/runner.py"
"$K" image rootfs "sandpod.local/executor-data:$TAG" "$R" \
  --config.user 1000:1000 --config.workingdir /tmp --config.cmd python3 --config.cmd /sandpod/runner.py \
  --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --config.env LANG=C.UTF-8 \
  --config.env PYTHONDONTWRITEBYTECODE=1 --config.env PYTHONUNBUFFERED=1 \
  --config.env PIP_DISABLE_PIP_VERSION_CHECK=1 --config.env PIP_NO_WARN_SCRIPT_LOCATION=1 \
  --config.env PIP_ROOT_USER_ACTION=ignore --config.env HOME=/tmp >&2
BUILT=$(push "$(archive "sandpod.local/executor-data:$TAG")" "sandpod/executor-data:$TAG")

# (c) The service image, following the Dockerfile by hand (no Docker engine here): node, dist/,
# package.json and the production dependencies; uid 1000; `node dist/main.js`.
log "service image sandpod.local/sandpod:$TAG (npm run build)"
npm run build >&2
S=$W/service
cp -a "$(rootfs bookworm-minbase '')" "$S"
install -D -m 0755 "$(readlink -f "$(command -v node)")" "$S/usr/local/bin/node"
mkdir "$S/app"
cp -a package.json package-lock.json dist "$S/app/"
(cd "$S/app" && npm ci --omit=dev --ignore-scripts --no-audit --no-fund >&2)
useradd -R "$S" --uid 1000 --user-group --no-create-home --home-dir /tmp --shell /usr/sbin/nologin node
grep -qx 'CMD \["node", "dist/main.js"\]' Dockerfile || { echo "images.sh: the Dockerfile's CMD changed; update this script" >&2; exit 1; }
"$K" image rootfs "sandpod.local/sandpod:$TAG" "$S" --config.user 1000:1000 --config.workingdir /app \
  --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --config.env NODE_ENV=production --config.env SVC_WORKSPACE=/tmp/sandpod --config.env SVC_HOST=0.0.0.0 \
  --config.env PORT=8000 --config.cmd node --config.cmd dist/main.js >&2
SERVICE=$(push "$(archive "sandpod.local/sandpod:$TAG")" "sandpod/sandpod:$TAG")

log "done"
cat <<EOF
export SANDPOD_E2E_KUBECONFIG=$KUBECONFIG
export SANDPOD_E2E_IMAGE=sandpod.local/executor:$TAG
export SANDPOD_E2E_DATA_IMAGE=sandpod.local/executor-data:$TAG
export SANDPOD_E2E_BUILT_IMAGE=$BUILT
export SANDPOD_E2E_SERVICE_IMAGE=$SERVICE
EOF
