# syntax=docker/dockerfile:1
# The sandpod service image (API, dispatcher, Kubernetes runtime): the compiled service (dist/, from
# `npm run build`) and its production dependencies; no TypeScript toolchain, nothing compiled at start.
#   docker build -t ghcr.io/sandpod/sandpod:0.1.0 .
# The chart runs it as uid/gid 1000 (the image's `node` user) with a read-only root filesystem and an
# emptyDir on /tmp (SVC_WORKSPACE).
ARG NODE_IMAGE=node:20-slim

# dist/ from src/ (TypeScript is a dev dependency, so this stage installs them all).
FROM ${NODE_IMAGE} AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --ignore-scripts --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ./
COPY src ./src
RUN npm run build

# Production dependencies only. No install scripts: none of them needs one to run.
FROM ${NODE_IMAGE} AS deps
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --ignore-scripts --no-audit --no-fund && npm cache clean --force

FROM ${NODE_IMAGE}
ENV NODE_ENV=production \
    SVC_WORKSPACE=/tmp/sandpod \
    SVC_HOST=0.0.0.0 \
    PORT=8000
WORKDIR /app
COPY --from=deps /app/node_modules ./node_modules
COPY --from=build /app/dist ./dist
# package.json: "type": "module" for dist/, and the version the service reports (../package.json).
COPY package.json ./
USER 1000:1000
EXPOSE 8000
# node directly (not npm): signals reach the service, which drains on SIGTERM.
CMD ["node", "dist/main.js"]
