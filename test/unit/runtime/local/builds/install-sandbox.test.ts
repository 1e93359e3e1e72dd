import { describe, expect, it } from 'vitest';
import { parseConfig } from '../../../../../src/config.ts';
import { hostMatches } from '../../../../../src/jobtypes/host-patterns.ts';
import { installAllowedHosts, urlHostPattern } from '../../../../../src/runtime/local/builds/install-sandbox.ts';

const pip = (p: Record<string, unknown>) => parseConfig({ pip: p }, {}).pip;

describe('urlHostPattern', () => {
  it.each([
    ['https://pypi.org/simple/', 'pypi.org:443'],
    ['http://127.0.0.1:8080/simple', '127.0.0.1:8080'],
    ['http://mirror.internal/', 'mirror.internal:80'],
    ['https://user:secret@repo.example.com:8443/pypi/', 'repo.example.com:8443'],
    ['http://[::1]:3141/root/pypi/', '[::1]:3141'],
    ['HTTPS://PyPI.Example.COM/', 'pypi.example.com:443'],
    ['/opt/wheels', null],
    ['file:///opt/wheels', null],
    ['ftp://host/x', null],
    ['not a url', null],
  ])('%s → %s', (url, want) => {
    expect(urlHostPattern(url)).toBe(want);
  });
});

describe('installAllowedHosts: only the configured indexes', () => {
  it.each<[string, Record<string, unknown>, string[]]>([
    ['default: PyPI and its file host', {}, ['files.pythonhosted.org:443', 'pypi.org:443']],
    ['a configured index replaces PyPI', { index_url: 'http://127.0.0.1:3141/simple/' }, ['127.0.0.1:3141']],
    ['no_index: only find-links hosts', { no_index: true, index_url: 'https://ignored.example/', find_links: ['/opt/wheels', 'https://wheels.example/x/'] }, ['wheels.example:443']],
    ['no_index with a directory only: nothing', { no_index: true, find_links: ['/opt/wheels', 'file:///srv/w'] }, []],
    [
      'index and find-links URLs in extra_args, both spellings',
      { no_index: true, extra_args: ['--extra-index-url', 'https://extra.example/simple', '--find-links=http://10.0.0.5:8000/', '-i', 'https://i.example/', '--pre'] },
      ['10.0.0.5:8000', 'extra.example:443', 'i.example:443'],
    ],
    ['allowed_hosts as given', { no_index: true, allowed_hosts: ['files.example.net:443'] }, ['files.example.net:443']],
  ])('%s', (_name, p, want) => {
    expect(installAllowedHosts(pip(p)).sort()).toEqual(want.sort());
  });

  it('a loopback index allows its own port only, never the host’s other services', () => {
    const hosts = installAllowedHosts(pip({ index_url: 'http://127.0.0.1:3141/simple/' }));
    expect(hostMatches('127.0.0.1', 3141, hosts)).toBe(true);
    for (const port of [5432, 8000, 80, 443]) expect(hostMatches('127.0.0.1', port, hosts)).toBe(false);
    expect(hostMatches('localhost', 3141, hosts)).toBe(false);
    expect(hostMatches('169.254.169.254', 80, hosts)).toBe(false);
  });

  it('pip.allowed_hosts must be host patterns', () => {
    expect(() => parseConfig({ pip: { allowed_hosts: ['http://x/'] } }, {})).toThrow(/host pattern/);
  });
});
