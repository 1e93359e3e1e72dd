/** The console's shell: navigation, the token prompt, and the page for the address's hash. */
import './style.css';
import { render } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import { getToken, needsToken, onAuthChange, setToken } from './api.ts';
import { DlqPage } from './pages/dlq.tsx';
import { HealthPage } from './pages/health.tsx';
import { RunPage } from './pages/run.tsx';
import { RunsPage } from './pages/runs.tsx';
import { SessionPage } from './pages/session.tsx';
import { SessionsPage } from './pages/sessions.tsx';
import { SubmitPage } from './pages/submit.tsx';
import { useRoute, type Route } from './ui.tsx';

function Page({ route }: { route: Route }) {
  const [first, second] = route.path;
  if (first === 'runs' && second) return <RunPage id={second} />;
  if (first === 'submit') return <SubmitPage />;
  if (first === 'sessions' && second) return <SessionPage id={second} />;
  if (first === 'sessions') return <SessionsPage />;
  if (first === 'dlq') return <DlqPage route={route} />;
  if (first === 'health') return <HealthPage />;
  return <RunsPage route={route} />;
}

/** Asks for the API token when the service wants one; kept in this tab's sessionStorage. */
function TokenForm({ onDone }: { onDone: () => void }) {
  const [value, setValue] = useState('');
  const rejected = needsToken() && getToken() !== null;
  return (
    <form
      class="token card"
      onSubmit={(e) => {
        e.preventDefault();
        if (value.trim()) setToken(value.trim());
        onDone();
      }}
    >
      <p>
        {rejected ? 'The service did not accept the token. ' : 'This service asks for an API token. '}
        It is kept in this browser tab only (sessionStorage) and sent as <code>Authorization: Bearer</code>.
      </p>
      <input name="token" type="password" autocomplete="off" placeholder="API token" aria-label="API token" value={value} onInput={(e) => setValue(e.currentTarget.value)} />
      <button type="submit" class="primary">
        Use token
      </button>
    </form>
  );
}

function App() {
  const route = useRoute();
  const [, setAuthTick] = useState(0);
  const [tokenTick, setTokenTick] = useState(0);
  const [editing, setEditing] = useState(false);
  useEffect(
    () =>
      onAuthChange((what) => {
        setAuthTick((t) => t + 1); // show or hide the prompt
        if (what === 'token') setTokenTick((t) => t + 1); // load the page again with the new token
      }),
    [],
  );
  const section = route.path[0] ?? 'runs';
  const asking = editing || needsToken();
  const nav = (name: string, label: string) => (
    <a href={`#/${name}`} class={section === name ? 'current' : ''}>
      {label}
    </a>
  );
  return (
    <>
      <header>
        <a class="brand" href="#/runs">
          sandpod
        </a>
        <nav>
          {nav('runs', 'Runs')}
          {nav('submit', 'New run')}
          {nav('sessions', 'Sessions')}
          {nav('dlq', 'Dead letters')}
          {nav('health', 'Health')}
          <a href="docs">API</a>
        </nav>
        <span class="spacer" />
        {getToken() ? (
          <button type="button" class="link" onClick={() => setToken(null)}>
            Forget token
          </button>
        ) : (
          <button type="button" class="link" onClick={() => setEditing(true)}>
            Token
          </button>
        )}
      </header>
      <main>
        {asking ? <TokenForm onDone={() => setEditing(false)} /> : null}
        {/* A new token remounts the page, so it loads again with it. */}
        <Page key={`${route.path.join('/')}|${tokenTick}`} route={route} />
      </main>
    </>
  );
}

render(<App />, document.getElementById('app')!);
