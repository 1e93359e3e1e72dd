# syntax=docker/dockerfile:1
# The sandpod service image (API, dispatcher, Kubernetes runtime). No build step: the TypeScript
# sources run through tsx, a runtime dependency.
#   docker build -t ghcr.io/sandpod/sandpod:0.1.0 .
# The chart runs it as uid/gid 1000 (the image's `node` user) with a read-only root filesystem and an
# emptyDir on /tmp (tsx's transform cache, npm's cache for `npm run migrate`, SVC_WORKSPACE).
ARG NODE_IMAGE=node:20-slim

FROM ${NODE_IMAGE} AS deps
WORKDIR /app
COPY package.json package-lock.json ./
# Production dependencies only (tsx is one). No install scripts: esbuild (under tsx) finds its binary
# in the @esbuild/<platform> optional package without its postinstall.
RUN npm ci --omit=dev --ignore-scripts --no-audit --no-fund && npm cache clean --force

FROM ${NODE_IMAGE}
ENV NODE_ENV=production \
    SVC_WORKSPACE=/tmp/sandpod \
    PORT=8000
WORKDIR /app
COPY --from=deps /app/node_modules ./node_modules
COPY package.json package-lock.json tsconfig.json ./
COPY src ./src
USER 1000:1000
EXPOSE 8000
# node directly (not npm/npx): signals reach the service, which drains on SIGTERM.
CMD ["node", "--import", "tsx", "src/main.ts"]
