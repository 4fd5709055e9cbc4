// etl-craft plugin UI: one page, hash routing, no framework, no build step.
// Views: #/ (pipelines), #/pipelines/<code>, #/runs/<id>, and ?dag_id=D&run_id=R (the Engine
// runs of one Airflow DAG run). Every DOM node is built with createElement/textContent.
'use strict';

(() => {
  // The query string, decoded without turning '+' into a space: Airflow 3.1 puts the DAG run id into the
  // DAG-run view's URL as it is (3.3 percent-encodes it), and run ids hold '+' ("…+00:00").
  const PAGE_PARAMS = new Map(
    window.location.search.replace(/^\?/, '').split('&').filter(Boolean).map((pair) => {
      const at = pair.indexOf('=');
      const decode = (text) => {
        try { return decodeURIComponent(text); } catch (e) { return text; }
      };
      return at < 0 ? [decode(pair), ''] : [decode(pair.slice(0, at)), decode(pair.slice(at + 1))];
    }),
  );
  const CONN_ID = PAGE_PARAMS.get('conn_id') || null;
  const DAG_ID = PAGE_PARAMS.get('dag_id') || null;
  const DAG_RUN_ID = PAGE_PARAMS.get('run_id') || null;
  const RUNS_PAGE_SIZE = 20;

  const main = document.getElementById('main');
  let renderToken = 0; // a newer navigation makes older, still pending, renders stale
  let flash = null; // one-shot notice shown after a reload (e.g. "Pipeline paused")

  // ---------------------------------------------------------------- DOM helpers

  // el('td', {class: 'x', 'data-testid': 'y'}, 'text', node, ...): attributes via setAttribute,
  // strings via text nodes, null/undefined/false children skipped.
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    if (attrs) {
      for (const [name, value] of Object.entries(attrs)) {
        if (value === null || value === undefined || value === false) continue;
        node.setAttribute(name, value === true ? '' : String(value));
      }
    }
    append(node, ...children);
    return node;
  }

  // append(node, 'text', otherNode, [nested, list], null): nulls are skipped, arrays flattened.
  function append(node, ...children) {
    for (const child of children) {
      if (child === null || child === undefined || child === false) continue;
      if (Array.isArray(child)) append(node, ...child);
      else if (child instanceof Node) node.appendChild(child);
      else node.appendChild(document.createTextNode(String(child)));
    }
  }

  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
  }

  const DASH = '—';

  function text(value) {
    return value === null || value === undefined || value === '' ? DASH : String(value);
  }

  // "2026-07-01T06:00:00.000Z" -> "2026-07-01 06:00:00 UTC"; unparsable text is shown as is.
  function fmtTime(iso) {
    if (iso === null || iso === undefined || iso === '') return DASH;
    if (/^\d{4}-\d\d-\d\d$/.test(iso)) return iso;  // a date (RUN_DATE): no time of day to show
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return String(iso);
    const p = (n) => String(n).padStart(2, '0');
    return `${d.getUTCFullYear()}-${p(d.getUTCMonth() + 1)}-${p(d.getUTCDate())} ` +
      `${p(d.getUTCHours())}:${p(d.getUTCMinutes())}:${p(d.getUTCSeconds())} UTC`;
  }

  function timeCell(iso) {
    return el('td', {class: 'nowrap', title: iso || null}, fmtTime(iso));
  }

  const BADGE_COLOURS = {
    SUCCESS: 'green', MET: 'green', SATISFIED: 'green',
    FAILED: 'red', TIMED_OUT: 'red', LOST: 'red', BREACHED: 'red', UNSATISFIED: 'red',
    'IN-PROGRESS': 'blue', RUNNING: 'blue', CLAIMED: 'blue',
    QUEUED: 'amber', BYPASSED: 'amber', PAUSED: 'amber',
    SKIPPED: 'grey', CANCELLED: 'grey',
  };

  function badge(value, testid) {
    if (value === null || value === undefined || value === '') return el('span', {class: 'muted'}, DASH);
    const colour = BADGE_COLOURS[String(value).toUpperCase()] || 'grey';
    return el('span', {class: `badge badge-${colour}`, 'data-testid': testid || null}, String(value));
  }

  // {"SUCCESS": 3, "SKIPPED": 1} -> "3 SUCCESS, 1 SKIPPED" (line breaks only after commas)
  function fmtCounts(counts) {
    if (!counts || typeof counts !== 'object') return DASH;
    const parts = Object.entries(counts)
      .filter(([, n]) => Number(n) > 0)
      .map(([status, n]) => `${n} ${status}`);
    if (!parts.length) return DASH;
    return parts.map((part, i) => [i ? ', ' : '', el('span', {class: 'nowrap'}, part)]);
  }

  function fmtSla(hours) {
    return hours === null || hours === undefined ? DASH : `${hours} h`;
  }

  function fmtWho(who, kind) {
    if (!who && !kind) return DASH;
    if (!kind) return String(who);
    return `${who || 'unknown'} (${kind})`;
  }

  function table(testid, headers, rows, emptyText) {
    if (!rows.length) return el('p', {class: 'muted', 'data-testid': testid}, emptyText);
    return el('div', {class: 'table-wrap'},
      el('table', {class: 'grid', 'data-testid': testid},
        el('thead', null, el('tr', null, headers.map((h) => el('th', {scope: 'col'}, h)))),
        el('tbody', null, rows)));
  }

  function section(title, ...children) {
    return el('section', {class: 'block'}, el('h2', null, title), children);
  }

  // ------------------------------------------------------------------ links

  // Fragment-only links keep the page's query string (conn_id, and dag_id/run_id in the
  // DAG-run view), so internal navigation never drops the connection choice.
  function hashHref(...segments) {
    return '#/' + segments.map((s) => encodeURIComponent(String(s))).join('/');
  }

  function pipelineLink(code) {
    return el('a', {href: hashHref('pipelines', code)}, String(code));
  }

  function runLink(id, label) {
    return el('a', {href: hashHref('runs', id)}, label || `#${id}`);
  }

  // ------------------------------------------------------------------- API

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  // Relative to the page (…/etl-craft/ui/) so a proxy prefix in front of Airflow still works.
  function apiUrl(path, query) {
    const url = new URL('../api/v1/' + path, document.baseURI);
    for (const [name, value] of Object.entries(query || {})) {
      if (value !== null && value !== undefined && value !== '') url.searchParams.set(name, String(value));
    }
    if (CONN_ID) url.searchParams.set('conn_id', CONN_ID);
    return url.toString();
  }

  function detailMessage(body) {
    if (!body || typeof body !== 'object') return null;
    const detail = body.detail;
    if (typeof detail === 'string') return detail;
    if (Array.isArray(detail)) { // FastAPI request validation errors
      const msgs = detail.map((d) => {
        if (!d || typeof d !== 'object') return String(d);
        const where = Array.isArray(d.loc) ? d.loc.join('.') : '';
        return where ? `${where}: ${d.msg}` : String(d.msg);
      });
      return msgs.join('; ');
    }
    if (detail && typeof detail === 'object') {
      if (typeof detail.message === 'string') return detail.message;
      if (typeof detail.error === 'string') return detail.error;
    }
    if (typeof body.message === 'string') return body.message;
    return null;
  }

  async function api(method, path, {query, body} = {}) {
    const init = {method, credentials: 'same-origin', headers: {Accept: 'application/json'}};
    if (body !== undefined) {
      init.headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let response;
    try {
      response = await fetch(apiUrl(path, query), init);
    } catch (err) {
      throw new ApiError(0, `Could not reach the etl-craft API (${err && err.message ? err.message : 'network error'}).`);
    }
    let data = null;
    const raw = await response.text();
    if (raw) {
      try { data = JSON.parse(raw); } catch (_) { data = null; }
    }
    if (!response.ok) {
      let message = detailMessage(data);
      if (response.status === 401) {
        message = 'You are not signed in: sign in to Airflow, then reload this page.' +
          (message ? ` (${message})` : '');
      } else if (!message) {
        message = response.statusText || 'The request failed.';
      }
      throw new ApiError(response.status, message);
    }
    if (data === null) throw new ApiError(response.status, 'The API answered with something that is not JSON.');
    return data;
  }

  function errorBox(err) {
    const status = err instanceof ApiError && err.status ? `HTTP ${err.status}: ` : '';
    const message = err && err.message ? err.message : String(err);
    return el('div', {class: 'error-box', role: 'alert', 'data-testid': 'error'}, status + message);
  }

  // --------------------------------------------------------------- routing

  function parseRoute() {
    const hash = window.location.hash.replace(/^#/, '');
    if ((hash === '' || hash === '/dag-run') && DAG_ID && DAG_RUN_ID) return {view: 'dagRun'};
    const parts = hash.replace(/^\/+/, '').split('/').filter((p) => p !== '').map((p) => {
      try { return decodeURIComponent(p); } catch (_) { return p; }
    });
    if (parts[0] === 'pipelines' && parts.length === 2) return {view: 'pipeline', code: parts[1]};
    if (parts[0] === 'runs' && parts.length === 2) return {view: 'run', id: parts[1]};
    if (parts.length === 0 || (parts[0] === 'pipelines' && parts.length === 1)) return {view: 'pipelines'};
    return {view: 'notFound', hash};
  }

  function renderNav(route) {
    const nav = document.getElementById('top-nav');
    clear(nav);
    const links = [];
    if (DAG_ID && DAG_RUN_ID) {
      links.push(el('a', {href: '#/dag-run', class: route.view === 'dagRun' ? 'current' : null}, 'This DAG run'));
    }
    links.push(el('a', {href: '#/', class: route.view === 'pipelines' ? 'current' : null}, 'Pipelines'));
    append(nav, links);
  }

  async function render() {
    const token = ++renderToken;
    const route = parseRoute();
    renderNav(route);
    const view = el('div', {class: 'view'});
    const loading = el('p', {class: 'muted'}, 'Loading…');
    clear(main);
    main.appendChild(loading);
    const stillCurrent = () => token === renderToken;
    try {
      if (route.view === 'pipelines') await viewPipelines(view, stillCurrent);
      else if (route.view === 'pipeline') await viewPipeline(view, route.code, stillCurrent);
      else if (route.view === 'run') await viewRun(view, route.id);
      else if (route.view === 'dagRun') await viewDagRun(view);
      else {
        document.title = 'etl-craft';
        append(view, el('h1', null, 'Not found'),
          el('p', null, 'There is no page at this address. ', el('a', {href: '#/'}, 'Go to the pipelines.')));
      }
    } catch (err) {
      if (!stillCurrent()) return;
      clear(view);
      append(view, el('h1', null, headingFor(route)), errorBox(err));
    }
    if (!stillCurrent()) return;
    clear(main);
    if (flash) {
      main.appendChild(el('div', {class: 'notice', role: 'status', 'data-testid': 'notice'}, flash));
      flash = null;
    }
    main.appendChild(view);
  }

  function headingFor(route) {
    if (route.view === 'pipeline') return `Pipeline ${route.code}`;
    if (route.view === 'run') return `Run ${route.id}`;
    if (route.view === 'dagRun') return `DAG run ${DAG_RUN_ID}`;
    return 'Pipelines';
  }

  // ------------------------------------------------------- view: pipelines

  async function viewPipelines(view) {
    document.title = 'Pipelines · etl-craft';
    const data = await api('GET', 'pipelines');
    const pipelines = Array.isArray(data.pipelines) ? data.pipelines : [];
    const rows = pipelines.map((p) => {
      const latest = p.latest_run || null;
      return el('tr', {'data-pipeline': p.pipeline_code},
        el('td', null, pipelineLink(p.pipeline_code)),
        el('td', null, text(p.pipeline_name)),
        el('td', null, activeText(p.active_flag)),
        el('td', {class: 'num'}, fmtSla(p.sla_in_hours)),
        el('td', {class: 'nowrap'}, latest ? [badge(latest.status, 'latest-status'), ' ', runLink(latest.pipeline_run_id)] : el('span', {class: 'muted'}, 'never run')),
        latest ? timeCell(latest.run_date) : el('td', null, DASH),
        el('td', null, latest ? badge(latest.sla_status) : DASH),
        el('td', null, p.pause ? pauseSummary(p.pause) : ''));
    });
    append(view,
      el('h1', null, 'Pipelines'),
      table('pipelines-table',
        ['Code', 'Name', 'State', 'SLA', 'Latest run', 'Run date', 'SLA status', 'Paused'],
        rows, 'No pipeline is registered in this Engine DB.'));
  }

  function activeText(flag) {
    if (flag === 'Y') return 'active';
    if (flag === 'N') return el('span', {class: 'muted'}, 'retired');
    return text(flag);
  }

  function pauseSummary(pause) {
    const who = fmtWho(pause.paused_by, pause.paused_by_kind);
    return el('span', {class: 'pause-summary', 'data-testid': 'paused-badge', title: `Paused since ${fmtTime(pause.paused_at)}`},
      el('span', {class: 'badge badge-amber'}, 'Paused'), ' ',
      el('span', {class: 'small'}, `by ${who}`, pause.reason ? `: ${pause.reason}` : ''));
  }

  // -------------------------------------------------------- view: pipeline

  async function viewPipeline(view, code, stillCurrent) {
    document.title = `Pipeline ${code} · etl-craft`;
    const enc = encodeURIComponent(code);
    const [state, page] = await Promise.all([
      api('GET', `pipelines/${enc}`),
      api('GET', `pipelines/${enc}/runs`, {query: {limit: RUNS_PAGE_SIZE}}),
    ]);
    const pipeline = state.pipeline || page.pipeline || {pipeline_code: code};
    const pause = state.pause || null;

    append(view,
      el('h1', null, `Pipeline ${pipeline.pipeline_code || code}`),
      pipeline.pipeline_name ? el('p', {class: 'subtitle'}, pipeline.pipeline_name) : null,
      el('dl', {class: 'facts', 'data-testid': 'pipeline-facts'},
        fact('State', activeText(pipeline.active_flag)),
        fact('SLA', fmtSla(pipeline.sla_in_hours)),
        state.run ? fact(state.run.status === 'IN-PROGRESS' ? 'Current run' : 'Latest run',
          [runLink(state.run.pipeline_run_id), ' ', badge(state.run.status), ' ', fmtTime(state.run.run_date)]) : null));

    if (pause) {
      append(view, el('div', {class: 'banner banner-paused', 'data-testid': 'pause-banner'},
        el('strong', null, 'Paused'),
        ` since ${fmtTime(pause.paused_at)} by ${fmtWho(pause.paused_by, pause.paused_by_kind)}: `,
        pause.reason ? pause.reason : el('em', null, 'no reason given')));
    } else {
      append(view, el('p', {class: 'not-paused', 'data-testid': 'not-paused'}, 'Not paused: new runs may start.'));
    }
    append(view, pauseControl(pipeline.pipeline_code || code, Boolean(pause)));

    const runsSection = section('Runs');
    append(view, runsSection);
    renderRunsPage(runsSection, code, page, stillCurrent);
  }

  function fact(label, value) {
    return el('div', {class: 'fact'}, el('dt', null, label), el('dd', null, value));
  }

  function runRow(run) {
    return el('tr', {'data-run-id': run.pipeline_run_id},
      el('td', null, runLink(run.pipeline_run_id)),
      el('td', null, badge(run.status)),
      el('td', {class: 'mono small run-key'}, runKey(run.run_key)),
      timeCell(run.run_date),
      timeCell(run.start_date),
      timeCell(run.end_date),
      el('td', null, badge(run.sla_status)),
      el('td', {class: 'small counts'}, fmtCounts(run.task_status_counts)));
  }

  // "airflow:<dag_id>:<run_id>" with line-break opportunities after the two prefix colons only.
  function runKey(key) {
    if (!key) return DASH;
    const parts = String(key).split(':');
    if (parts.length < 3) return String(key);
    return [`${parts[0]}:`, el('wbr'), `${parts[1]}:`, el('wbr'), el('span', {class: 'nowrap'}, parts.slice(2).join(':'))];
  }

  // First page builds the table; "Older runs" appends the next page into the same tbody.
  function renderRunsPage(container, code, page, stillCurrent) {
    const runs = Array.isArray(page.runs) ? page.runs : [];
    const t = table('runs-table', ['Run', 'Status', 'Run key', 'Run date', 'Start', 'End', 'SLA', 'Tasks'],
      runs.map(runRow), 'No run yet.');
    append(container, t);
    const tbody = t.querySelector('tbody');
    const more = el('div', {class: 'more'});
    append(container, more);

    // Shows the "Older runs" button while there is an older page; after a failed load the
    // error stays above the button so the user can retry.
    const showMore = (nextBefore, err) => {
      clear(more);
      if (err) append(more, errorBox(err));
      if (nextBefore === null || nextBefore === undefined || !tbody) return;
      const button = el('button', {type: 'button', class: 'btn', 'data-testid': 'older-runs'}, 'Older runs');
      button.addEventListener('click', async () => {
        button.disabled = true;
        button.textContent = 'Loading…';
        try {
          const next = await api('GET', `pipelines/${encodeURIComponent(code)}/runs`,
            {query: {limit: RUNS_PAGE_SIZE, before: nextBefore}});
          if (!stillCurrent()) return;
          append(tbody, (Array.isArray(next.runs) ? next.runs : []).map(runRow));
          showMore(next.next_before);
        } catch (e) {
          if (stillCurrent()) showMore(nextBefore, e);
        }
      });
      append(more, button);
    };
    showMore(page.next_before);
  }

  // Pause / Resume: a button that opens an inline form asking for a reason.
  function pauseControl(code, paused) {
    const action = paused ? 'resume' : 'pause';
    const label = paused ? 'Resume' : 'Pause';
    const box = el('div', {class: 'pause-control', 'data-testid': 'pause-control'});
    const open = el('button', {type: 'button', class: paused ? 'btn btn-primary' : 'btn btn-warn', 'data-testid': `${action}-button`}, label);
    box.appendChild(open);

    open.addEventListener('click', () => {
      open.hidden = true;
      const inputId = `reason-${action}`;
      const input = el('input', {type: 'text', id: inputId, name: 'reason', required: true, maxlength: 2000,
        autocomplete: 'off', placeholder: paused ? 'Why resume now?' : 'Why pause this pipeline?'});
      const confirm = el('button', {type: 'submit', class: 'btn btn-primary'}, 'Confirm');
      const cancel = el('button', {type: 'button', class: 'btn'}, 'Cancel');
      const problem = el('div', {class: 'form-problem', 'aria-live': 'assertive'});
      const form = el('form', {class: 'reason-form', 'data-testid': `${action}-form`, novalidate: true},
        el('p', {class: 'form-title'}, paused ? `Resume pipeline ${code}` : `Pause pipeline ${code}`),
        el('div', {class: 'form-row'},
          el('label', {for: inputId}, 'Reason'), input, confirm, cancel),
        problem);

      const close = () => {
        form.remove();
        open.hidden = false;
        open.focus();
      };
      cancel.addEventListener('click', close);
      form.addEventListener('keydown', (ev) => { if (ev.key === 'Escape') close(); });
      form.addEventListener('submit', async (ev) => {
        ev.preventDefault();
        clear(problem);
        const reason = input.value.trim();
        if (!reason) {
          append(problem, el('div', {class: 'error-box', role: 'alert'}, 'A reason is required.'));
          input.focus();
          return;
        }
        confirm.disabled = true;
        cancel.disabled = true;
        input.disabled = true;
        confirm.textContent = 'Sending…';
        try {
          const result = await api('POST', `pipelines/${encodeURIComponent(code)}/${action}`, {body: {reason}});
          const who = paused ? result.resumed_by : result.paused_by;
          flash = `Pipeline ${code} ${paused ? 'resumed' : 'paused'}${who ? ` by ${who}` : ''}.`;
          render();
        } catch (err) {
          append(problem, errorBox(err));
          confirm.disabled = false;
          cancel.disabled = false;
          input.disabled = false;
          confirm.textContent = 'Confirm';
          input.focus();
        }
      });
      box.appendChild(form);
      input.focus();
    });
    return box;
  }

  // ------------------------------------------------------------ view: run

  async function viewRun(view, id) {
    document.title = `Run ${id} · etl-craft`;
    if (!/^\d+$/.test(id)) throw new ApiError(0, `"${id}" is not a run id (a run id is a number).`);
    const data = await api('GET', `runs/${encodeURIComponent(id)}`);
    const entries = Array.isArray(data.runs) ? data.runs : [];
    append(view, el('h1', null, `Run ${id}`));
    if (!entries.length) {
      append(view, el('p', {class: 'muted'}, 'The API returned no run for this id.'));
      return;
    }
    for (const entry of entries) append(view, runDetails(entry, entries.length > 1));
  }

  async function viewDagRun(view) {
    document.title = `DAG run ${DAG_RUN_ID} · etl-craft`;
    append(view,
      el('h1', null, `DAG run ${DAG_RUN_ID}`),
      el('p', {class: 'subtitle'}, 'DAG ', el('span', {class: 'mono'}, DAG_ID), ': the Engine runs of this Airflow DAG run'));
    const data = await api('GET', 'runs', {query: {dag_id: DAG_ID, run_id: DAG_RUN_ID}});
    const entries = Array.isArray(data.runs) ? data.runs : [];
    if (!entries.length) {
      append(view, el('p', {class: 'muted', 'data-testid': 'no-engine-runs'},
        'No Engine run is recorded for this DAG run (yet).'));
      return;
    }
    for (const entry of entries) append(view, runDetails(entry, true));
  }

  // One Engine run: summary, task runs, attempts, gate decisions, interventions.
  function runDetails(entry, withHeading) {
    const run = entry.run || {};
    const pipeline = entry.pipeline || {};
    const box = el('article', {class: 'run', 'data-testid': 'run', 'data-run-id': run.pipeline_run_id});
    if (withHeading) {
      append(box, el('h2', {class: 'run-heading'}, runLink(run.pipeline_run_id, `Run ${run.pipeline_run_id}`),
        ' of pipeline ', pipelineLink(pipeline.pipeline_code), ' ', badge(run.status)));
    }
    const taskRuns = Array.isArray(run.task_runs) ? run.task_runs : [];
    const gates = Array.isArray(run.gate_decisions) ? run.gate_decisions : [];
    const interventions = Array.isArray(run.interventions) ? run.interventions : [];

    append(box,
      el('dl', {class: 'facts', 'data-testid': 'run-summary'},
        fact('Pipeline', [pipelineLink(pipeline.pipeline_code), pipeline.pipeline_name ? ` (${pipeline.pipeline_name})` : '']),
        fact('Status', badge(run.status, 'run-status')),
        fact('Run key', el('span', {class: 'mono'}, runKey(run.run_key))),
        fact('Run date', fmtTime(run.run_date)),
        fact('Start', fmtTime(run.start_date)),
        fact('End', fmtTime(run.end_date)),
        fact('SLA', [badge(run.sla_status), pipeline.sla_in_hours != null ? ` (${fmtSla(pipeline.sla_in_hours)})` : '']),
        fact('Output revision', text(run.output_revision)),
        fact('Trigger', text(run.trigger_kind)),
        fact('Backfill', run.backfill === 'Y' ? 'yes' : run.backfill === 'N' ? 'no' : text(run.backfill)),
        fact('Tasks', fmtCounts(run.task_status_counts))));

    append(box, section('Task runs', table('task-runs-table',
      ['Task', 'Status', 'Attempts', 'Rows written', 'Start', 'End', 'Error'],
      taskRuns.map(taskRow), 'This run has no task run.')));

    const withAttempts = taskRuns.filter((t) => Array.isArray(t.attempts) && t.attempts.length);
    const withLogs = taskRuns.filter((t) => t.task_log);
    if (withAttempts.length || withLogs.length) {
      append(box, section('Attempts',
        taskRuns.filter((t) => withAttempts.includes(t) || withLogs.includes(t)).map(attemptsBlock)));
    }

    append(box, section('Gate decisions', table('gate-decisions-table',
      ['Task', 'Depends on', 'Result', 'In words', 'Reason', 'Selected', 'Decided'],
      gates.map(gateRow), 'No gate decision was recorded for this run.')));

    append(box, section('Interventions', table('interventions-table',
      ['Action', 'Task', 'Status', 'Reason', 'By', 'When'],
      interventions.map(interventionRow), 'No intervention on this run.')));
    return box;
  }

  function taskRow(t) {
    const counts = ['source_count', 'target_count', 'insert_count', 'update_count', 'delete_count']
      .filter((k) => t[k] !== null && t[k] !== undefined)
      .map((k) => `${k.replace('_count', '')} ${t[k]}`).join(', ');
    return el('tr', {'data-task': t.task_code},
      el('td', {class: 'mono'}, text(t.task_code)),
      el('td', null, badge(t.status)),
      el('td', {class: 'num'}, text(t.attempt_count)),
      el('td', {class: 'num', title: counts || null}, text(t.rows_written)),
      timeCell(t.start_date),
      timeCell(t.end_date),
      el('td', {class: 'error-text'}, t.error_message ? t.error_message : ''));
  }

  function attemptsBlock(t) {
    const attempts = Array.isArray(t.attempts) ? t.attempts : [];
    const mapped = attempts.some((a) => a.map_index !== null && a.map_index !== undefined);
    const headers = ['Attempt'].concat(mapped ? ['Map index'] : [], ['Status', 'Host', 'PID', 'Started', 'Ended', 'Error']);
    const rows = attempts.map((a) => el('tr', {'data-attempt-id': a.attempt_id},
      el('td', {class: 'num'}, text(a.attempt_number)),
      mapped ? el('td', {class: 'num'}, a.map_index === null || a.map_index === undefined ? DASH : String(a.map_index)) : null,
      el('td', null, badge(a.status)),
      el('td', {class: 'mono small nowrap'}, text(a.host)),
      el('td', {class: 'num'}, text(a.pid)),
      timeCell(a.started_at),
      timeCell(a.ended_at),
      el('td', {class: 'error-text'}, a.error_message ? a.error_message : '')));
    return el('div', {class: 'attempts', 'data-task': t.task_code},
      el('h3', null, 'Task ', el('span', {class: 'mono'}, text(t.task_code)), ' ', badge(t.status)),
      table('attempts-table', headers, rows, 'No attempt recorded.'),
      t.task_log ? el('details', {class: 'task-log'}, el('summary', null, 'Task log'), el('pre', null, t.task_log)) : null);
  }

  // A sentence in words for one gate decision; the API's own `reason` is shown next to it.
  function gateSentence(g) {
    const upstream = g.depends_on_task_code
      ? `upstream task ${g.depends_on_task_code} of pipeline ${g.depends_on_pipeline_code}`
      : `upstream pipeline ${g.depends_on_pipeline_code}`;
    const subject = g.task_code ? `Task ${g.task_code}` : 'The pipeline run';
    const selected = g.selected_pipeline_run_id != null ? ` (run ${g.selected_pipeline_run_id})` : '';
    switch (g.result) {
      case 'UNSATISFIED':
        return `${subject} was not run: its dependency on ${upstream} was not satisfied (UNSATISFIED)`;
      case 'SATISFIED':
        return `${subject} could run: its dependency on ${upstream} was satisfied${selected} (SATISFIED)`;
      case 'BYPASSED':
        return `${subject} went ahead without waiting: the dependency on ${upstream} was bypassed (BYPASSED)`;
      default:
        return `${subject} depends on ${upstream}: ${text(g.result)}`;
    }
  }

  function gateRow(g) {
    const dep = g.depends_on_task_code
      ? `${g.depends_on_pipeline_code}.${g.depends_on_task_code}`
      : text(g.depends_on_pipeline_code);
    const selected = [];
    if (g.selected_pipeline_run_id != null) selected.push(runLink(g.selected_pipeline_run_id));
    if (g.selected_task_run_id != null) selected.push(el('span', {class: 'small'}, ` task run ${g.selected_task_run_id}`));
    if (g.selected_revision != null) selected.push(el('span', {class: 'small'}, ` rev ${g.selected_revision}`));
    return el('tr', {'data-decision-id': g.decision_id},
      el('td', {class: 'mono'}, g.task_code ? g.task_code : el('em', null, 'pipeline')),
      el('td', {class: 'mono'}, dep),
      el('td', null, badge(g.result)),
      el('td', {class: 'sentence'}, gateSentence(g)),
      el('td', {class: 'wrap'}, text(g.reason)),
      el('td', {class: 'nowrap'}, selected.length ? selected : DASH),
      timeCell(g.decided_at));
  }

  function interventionRow(i) {
    const change = i.from_status || i.to_status
      ? [badge(i.from_status), ' → ', badge(i.to_status)] : DASH;
    return el('tr', {'data-intervention-id': i.intervention_id},
      el('td', null, text(i.action)),
      el('td', {class: 'mono'}, text(i.task_code)),
      el('td', {class: 'nowrap'}, change),
      el('td', {class: 'wrap'}, text(i.reason)),
      el('td', null, fmtWho(i.requested_by, i.requested_by_kind)),
      timeCell(i.requested_at));
  }

  // ------------------------------------------------------------------ start

  function start() {
    const connName = document.getElementById('conn-name');
    if (connName) {
      connName.textContent = CONN_ID || 'etl_craft_default';
      if (!CONN_ID) connName.appendChild(el('span', {class: 'muted'}, ' (default)'));
    }
    const reload = document.getElementById('reload');
    if (reload) reload.addEventListener('click', () => render());
    window.addEventListener('hashchange', () => render());
    render();
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start);
  else start();
})();
