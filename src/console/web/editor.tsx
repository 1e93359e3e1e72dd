/**
 * The Python editor: CodeMirror 6 with its Python language (highlighting, indentation on input,
 * bracket matching and closing, completion of Python's names and the file's own), undo history and
 * the standard key bindings (Tab indents: `indentWithTab`, with Escape then Tab to leave the editor).
 * CodeMirror injects its styles as a <style> element; the page's Content-Security-Policy admits it
 * through the per-response nonce the service puts in `<meta name="csp-nonce">` (src/api/routes/ui.ts).
 */
import { autocompletion, closeBrackets, closeBracketsKeymap, completionKeymap } from '@codemirror/autocomplete';
import { defaultKeymap, history, historyKeymap, indentWithTab } from '@codemirror/commands';
import { python } from '@codemirror/lang-python';
import { bracketMatching, defaultHighlightStyle, foldGutter, indentOnInput, syntaxHighlighting } from '@codemirror/language';
import { drawSelection, EditorView, highlightActiveLine, highlightActiveLineGutter, highlightSpecialChars, keymap, lineNumbers } from '@codemirror/view';
import { useEffect, useRef } from 'preact/hooks';

/** The style nonce the service gave this page, if any. */
export function cspNonce(): string {
  return document.querySelector<HTMLMetaElement>('meta[name="csp-nonce"]')?.content ?? '';
}

export function PythonEditor({ value, onChange, label }: { value: string; onChange: (v: string) => void; label: string }) {
  const host = useRef<HTMLDivElement>(null);
  const view = useRef<EditorView>();
  const changed = useRef(onChange);
  changed.current = onChange;
  useEffect(() => {
    const v = new EditorView({
      doc: value,
      parent: host.current!,
      extensions: [
        lineNumbers(),
        highlightActiveLineGutter(),
        highlightSpecialChars(),
        foldGutter(),
        drawSelection(),
        indentOnInput(),
        syntaxHighlighting(defaultHighlightStyle, { fallback: true }),
        bracketMatching(),
        closeBrackets(),
        autocompletion(),
        highlightActiveLine(),
        history(),
        keymap.of([...closeBracketsKeymap, ...defaultKeymap, ...historyKeymap, ...completionKeymap, indentWithTab]),
        python(),
        EditorView.cspNonce.of(cspNonce()),
        EditorView.contentAttributes.of({ 'aria-label': label }),
        EditorView.updateListener.of((u) => {
          if (u.docChanged) changed.current(u.state.doc.toString());
        }),
      ],
    });
    view.current = v;
    return () => v.destroy();
    // The editor owns its text after creation; `value` only seeds it.
  }, []);
  return <div class="editor" ref={host} />;
}
