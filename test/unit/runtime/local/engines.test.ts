import { execFileSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { candidateEngines } from '../../../../src/runtime/local/engines.ts';
import { programEnv } from '../../../../src/runtime/local/runs/runner-command.ts';
import { RUNNER_PATH } from '../../../../src/sandbox/paths.ts';

describe('candidateEngines', () => {
  it('auto lists the strongest first; strict allows only gVisor', () => {
    expect(candidateEngines({ sandbox_engine: 'auto', security_mode: 'permissive' })).toEqual(['gvisor', 'bubblewrap', 'process']);
    expect(candidateEngines({ sandbox_engine: 'auto', security_mode: 'strict' })).toEqual(['gvisor']);
    expect(candidateEngines({ sandbox_engine: 'bubblewrap', security_mode: 'strict' })).toEqual([]);
    expect(candidateEngines({ sandbox_engine: 'process', security_mode: 'permissive' })).toEqual(['process']);
  });
});

describe('programEnv', () => {
  it("is exactly the runner's program environment, so the runner never needs to re-exec", () => {
    // Ask the real runner (imported as a module) what it would build for the same arguments.
    const py = `
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location('runner', sys.argv[1])
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
a = m.parse_args(['--python-path', '/deps', '--env', 'FOO=bar=baz', '--env', 'PATH=/custom'])
print(json.dumps(m.program_env(a)))
`;
    const out = execFileSync('/usr/bin/python3', ['-I', '-c', py, RUNNER_PATH], { encoding: 'utf8' });
    expect(JSON.parse(out)).toEqual(programEnv(['/deps'], { FOO: 'bar=baz', PATH: '/custom' }));
  });
});
