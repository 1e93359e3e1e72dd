/** The submit form: code (Python editor), input JSON, job type (GET /job-types), requirements, timeout. */
import { useState } from 'preact/hooks';
import { api, parseExact } from '../api.ts';
import { PythonEditor } from '../editor.tsx';
import { ErrorBox, href, usePoll } from '../ui.tsx';

const DRAFT_KEY = 'sandpod.draft';

export const SAMPLE_CODE = `import json
import time

data = json.load(open("/input/data.json"))
for i in range(3):
    print("tick", i, flush=True)
    time.sleep(0.5)

# Files in /output are kept as artifacts; result.json becomes the run's output.
with open("/output/result.json", "w") as f:
    json.dump({"hello": data.get("name", "world")}, f)
`;

interface Draft {
  code: string;
  input: string;
  jobType: string;
  requirements: string;
  timeout: string;
}

function loadDraft(): Draft {
  const empty: Draft = { code: SAMPLE_CODE, input: '{"name": "world"}', jobType: 'default', requirements: '', timeout: '' };
  try {
    return { ...empty, ...(JSON.parse(sessionStorage.getItem(DRAFT_KEY) ?? '{}') as Partial<Draft>) };
  } catch {
    return empty;
  }
}

/** The input's problem, or '' when it is empty or a JSON object. */
export function inputProblem(text: string): string {
  if (!text.trim()) return '';
  try {
    const v = parseExact(text);
    return v !== null && typeof v === 'object' && !Array.isArray(v) ? '' : 'the input must be a JSON object';
  } catch (err) {
    return `not JSON: ${(err as Error).message}`;
  }
}

export function SubmitPage() {
  const [draft, setDraft] = useState(loadDraft);
  const [error, setError] = useState<Error>();
  const [busy, setBusy] = useState(false);
  const types = usePoll(() => api.jobTypes(), 0, 'types');
  const update = (patch: Partial<Draft>) => {
    setDraft((d) => {
      const next = { ...d, ...patch };
      sessionStorage.setItem(DRAFT_KEY, JSON.stringify(next));
      return next;
    });
  };
  const problem = inputProblem(draft.input);
  const selected = types.data?.find((t) => t.name === draft.jobType);

  const submit = async (e: Event) => {
    e.preventDefault();
    if (problem) return;
    setBusy(true);
    setError(undefined);
    try {
      const requirements = draft.requirements
        .split('\n')
        .map((l) => l.trim())
        .filter((l) => l && !l.startsWith('#'));
      const sub = await api.submit({
        code: draft.code,
        input_json: draft.input,
        job_type: draft.jobType,
        ...(requirements.length ? { requirements } : {}),
        ...(draft.timeout.trim() ? { timeout: Number(draft.timeout) } : {}),
      });
      location.hash = href(['runs', sub.job_id]);
    } catch (err) {
      setError(err as Error);
    } finally {
      setBusy(false);
    }
  };

  return (
    <form class="submit" onSubmit={submit}>
      <div class="toolbar">
        <h1>New run</h1>
      </div>
      <label class="block">
        <span>Code (Python)</span>
      </label>
      <PythonEditor value={draft.code} onChange={(code) => update({ code })} label="Python code" />
      <div class="grid">
        <label class="block">
          <span>Input (JSON object, read by the program from /input/data.json)</span>
          <textarea name="input" rows={6} spellcheck={false} value={draft.input} onInput={(e) => update({ input: e.currentTarget.value })} />
          {problem ? <span class="error">{problem}</span> : null}
        </label>
        <div>
          <label class="block">
            <span>Job type</span>
            <select name="job_type" value={draft.jobType} onChange={(e) => update({ jobType: e.currentTarget.value })}>
              {(types.data ?? [{ name: draft.jobType }]).map((t) => (
                <option value={t.name}>{t.name}</option>
              ))}
            </select>
            {selected ? (
              <span class="muted">
                Python {selected.python_version}, {selected.memory_limit} memory, {selected.cpu_limit} CPU, {selected.timeout} s
                {selected.requirements.length ? `, with ${selected.requirements.join(', ')}` : ''}
                {selected.network.mode === 'none' ? ', no network' : ''}
              </span>
            ) : null}
          </label>
          <label class="block">
            <span>Extra requirements (one per line, like numpy&gt;=1.26)</span>
            <textarea name="requirements" rows={3} spellcheck={false} value={draft.requirements} onInput={(e) => update({ requirements: e.currentTarget.value })} />
          </label>
          <label class="block">
            <span>Timeout in seconds (empty: the job type's)</span>
            <input name="timeout" type="number" min={1} value={draft.timeout} onInput={(e) => update({ timeout: e.currentTarget.value })} />
          </label>
        </div>
      </div>
      <ErrorBox error={types.error} />
      <ErrorBox error={error} />
      <button type="submit" class="primary" disabled={busy || !!problem}>
        {busy ? 'Submitting…' : 'Run'}
      </button>
    </form>
  );
}
