/**
 * The local runtime's egress proxy: one per run on a Unix socket. The implementation is shared with
 * the cluster's proxy and lives in src/egress/proxy.ts; this path stays for the local runtime's imports.
 */
export { EgressProxy, isPublicAddress, type EgressDecision, type EgressProxyOptions, type Lookup } from '../../../egress/proxy.ts';
