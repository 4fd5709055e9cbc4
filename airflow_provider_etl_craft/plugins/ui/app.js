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
    // The chart's data failing leaves the rest of the page working: its error shows in the chart's place.
    const [state, page, trend] = await Promise.all([
      api('GET', `pipelines/${enc}`),
      api('GET', `pipelines/${enc}/runs`, {query: {limit: RUNS_PAGE_SIZE}}),
      api('GET', `pipelines/${enc}/trend`, {query: {limit: TREND_RUNS}}).catch((err) => err),
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

    append(view, trendSection(trend, pipeline));

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

    append(box, timelineSection(run));

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
    const parked = attempts.some((a) => a.queued_at);
    const headers = ['Attempt'].concat(mapped ? ['Map index'] : [], ['Status', 'Host', 'PID', 'Started', 'Ended'],
      parked ? ['Last parked'] : [], ['Error']);
    const rows = attempts.map((a) => el('tr', {'data-attempt-id': a.attempt_id},
      el('td', {class: 'num'}, text(a.attempt_number)),
      mapped ? el('td', {class: 'num'}, a.map_index === null || a.map_index === undefined ? DASH : String(a.map_index)) : null,
      el('td', null, badge(a.status)),
      el('td', {class: 'mono small nowrap'}, text(a.host)),
      el('td', {class: 'num'}, text(a.pid)),
      timeCell(a.started_at),
      timeCell(a.ended_at),
      parked ? timeCell(a.queued_at) : null,
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

  // ---------------------------------------------------------------- charts

  // Durations: 4.2 -> "4.2 s", 75 -> "1 min 15 s", 3725 -> "1 h 2 min".
  function fmtDuration(seconds) {
    if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return DASH;
    if (seconds < 60) return `${seconds < 10 ? Math.round(seconds * 10) / 10 : Math.round(seconds)} s`;
    const total = Math.round(seconds);
    const h = Math.floor(total / 3600), m = Math.floor((total % 3600) / 60), s = total % 60;
    if (h) return m ? `${h} h ${m} min` : `${h} h`;
    return s ? `${m} min ${s} s` : `${m} min`;
  }

  // The unit of a duration axis whose largest value is maxSeconds.
  function durationUnit(maxSeconds) {
    if (maxSeconds >= 5 * 3600) return {name: 'h', seconds: 3600};
    if (maxSeconds >= 120) return {name: 'min', seconds: 60};
    return {name: 's', seconds: 1};
  }

  // Width a chart gets: the page's, within bounds (a view is built before it is attached).
  function chartWidth() {
    const page = document.documentElement.clientWidth || 1000;
    return Math.max(480, Math.min(1200, page - 48));
  }

  // Colours of the charts; the same as the badges' (app.css), so a red mark means what a red badge means.
  const CHART = {
    duration: '#1558b0', failed: '#b3261e', breached: '#d98e00', sla: '#7b1fa2', grid: '#e2e6ea', axis: '#6b7785',
  };
  const TREND_RUNS = 50;

  // The pipeline page's duration chart (uPlot): one point per finished run, oldest left; failed runs and
  // SLA breaches marked; the SLA as a dashed line. `trend` is the API's document or the Error of its request.
  function trendSection(trend, pipeline) {
    const box = el('div', {class: 'trend', 'data-testid': 'trend'});
    const block = section('Duration of recent runs', box);
    if (trend instanceof Error) {
      append(box, errorBox(trend));
      return block;
    }
    const runs = (Array.isArray(trend.runs) ? trend.runs : []).filter((r) => typeof r.duration_seconds === 'number');
    if (!runs.length) {
      append(box, el('p', {class: 'muted', 'data-testid': 'trend-empty'}, 'No finished run yet: nothing to chart.'));
      return block;
    }
    if (typeof window.uPlot !== 'function') {
      append(box, errorBox(new Error('The charting library (vendor/uplot/uPlot.iife.min.js) did not load.')));
      return block;
    }
    const slaHours = pipeline.sla_in_hours;
    const slaSeconds = slaHours === null || slaHours === undefined ? null : Number(slaHours) * 3600;
    const seconds = runs.map((r) => r.duration_seconds);
    // An SLA far above every run would flatten the points against the axis: then the axis follows the runs
    // and the legend says the SLA line is above the chart.
    const slaShown = slaSeconds !== null && slaSeconds <= 3 * Math.max(...seconds);
    const unit = durationUnit(Math.max(...seconds, slaShown ? slaSeconds : 0));
    const ids = runs.map((r) => r.pipeline_run_id);
    const ys = seconds.map((s) => s / unit.seconds);
    const isFailed = (r) => r.status === 'FAILED';
    const isBreached = (r) => r.sla_status === 'BREACHED';
    const failed = runs.filter(isFailed);
    const breached = runs.filter(isBreached);
    const yMax = Math.max(...ys, slaShown ? slaSeconds / unit.seconds : 0) * 1.12 || 1;
    const valueText = (u, v) => (v === null || v === undefined ? DASH : fmtDuration(v * unit.seconds));
    const marks = (size, colour, fill, width) => ({show: true, size, width, stroke: colour, fill});

    const series = [
      {label: 'Run', value: (u, i) => (i === null || i === undefined || ids[i] === undefined ? DASH
        : `#${ids[i]} ${runs[i].status}, started ${fmtTime(runs[i].start_date)}`)},
      {label: 'Duration', stroke: CHART.duration, width: 1.5, value: valueText,
        points: marks(5, CHART.duration, CHART.duration, 1)},
      {label: 'Failed', stroke: CHART.failed, paths: () => null, value: valueText,
        points: marks(11, CHART.failed, CHART.failed, 1)},
      {label: 'SLA breached', stroke: CHART.breached, paths: () => null, value: valueText,
        points: marks(17, CHART.breached, 'rgba(0,0,0,0)', 2.5)},
    ];
    const data = [
      runs.map((_, i) => i),
      ys,
      runs.map((r, i) => (isFailed(r) ? ys[i] : null)),
      runs.map((r, i) => (isBreached(r) ? ys[i] : null)),
    ];
    if (slaSeconds !== null) {
      series.push({label: `SLA (${fmtSla(slaHours)})`, stroke: CHART.sla, width: 1.5, dash: [6, 4],
        points: {show: false}, value: () => (slaShown ? fmtDuration(slaSeconds) : `${fmtDuration(slaSeconds)}, above the chart`)});
      data.push(runs.map(() => slaSeconds / unit.seconds));
    }
    const axis = {stroke: CHART.axis, grid: {stroke: CHART.grid, width: 1}, ticks: {stroke: CHART.grid, width: 1}};
    const opts = {
      width: chartWidth(),
      height: 260,
      series,
      scales: {x: {time: false, range: [-0.5, runs.length - 0.5]}, y: {range: [0, yMax]}},
      axes: [
        {...axis, label: 'Run (oldest left, newest right)', space: 56, incrs: [1, 2, 5, 10, 20, 50, 100],
          values: (u, splits) => splits.map((i) => (Number.isInteger(i) && ids[i] !== undefined ? `#${ids[i]}` : ''))},
        {...axis, label: `Duration (${unit.name})`, size: 56},
      ],
      cursor: {drag: {x: false, y: false}},
      legend: {live: true},
    };
    const chart = el('div', {class: 'trend-chart', 'data-testid': 'trend-chart', 'data-unit': unit.name});
    append(box, chart);
    const plot = new window.uPlot(opts, data, chart);
    // A click on the chart opens the run under the cursor.
    plot.over.addEventListener('click', () => {
      const i = plot.cursor.idx;
      if (i !== null && i !== undefined && ids[i] !== undefined) window.location.hash = hashHref('runs', ids[i]);
    });
    const resize = () => {
      if (!chart.isConnected) window.removeEventListener('resize', resize);
      else plot.setSize({width: chartWidth(), height: 260});
    };
    window.addEventListener('resize', resize);

    const runLinks = (list) => list.map((r, i) => [i ? ', ' : '', runLink(r.pipeline_run_id)]);
    const sla = slaSeconds === null ? 'no SLA is set' : `SLA ${fmtSla(slaHours)}`;
    append(box,
      el('p', {class: 'small muted', 'data-testid': 'trend-summary'},
        `The last ${runs.length} finished run${runs.length === 1 ? '' : 's'} (at most ${trend.limit || TREND_RUNS}): `,
        `${failed.length} failed, ${breached.length} breached the SLA (${sla}). Click a point to open its run.`),
      failed.length ? el('p', {class: 'small', 'data-testid': 'trend-failed'}, 'Failed: ', runLinks(failed)) : null,
      breached.length ? el('p', {class: 'small', 'data-testid': 'trend-breached'}, 'SLA breached: ', runLinks(breached)) : null);
    return block;
  }

  // -- the run's timeline (plain SVG: one row per task run, a bar per attempt)

  const SVG_NS = 'http://www.w3.org/2000/svg';

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value !== null && value !== undefined && value !== false) node.setAttribute(name, String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function ms(iso) {
    if (!iso) return null;
    const t = new Date(iso).getTime();
    return Number.isNaN(t) ? null : t;
  }

  // Axis steps (ms) of the timeline: the first that gives at most ~8 ticks.
  const STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400]
    .map((s) => s * 1000);

  function clock(t, step) {
    const iso = new Date(t).toISOString();
    if (step >= 86400000) return iso.slice(5, 10);
    return step >= 60000 ? iso.slice(11, 16) : iso.slice(11, 19);
  }

  function statusClass(status) {
    return `st-${(BADGE_COLOURS[String(status || '').toUpperCase()] || 'grey')}`;
  }

  // Rows of the timeline: the run, then each task run (a mapped task: one row per map index).
  function timelineRows(run) {
    const rows = [];
    for (const t of Array.isArray(run.task_runs) ? run.task_runs : []) {
      const attempts = Array.isArray(t.attempts) ? t.attempts : [];
      const indexes = [...new Set(attempts.map((a) => (a.map_index === null || a.map_index === undefined ? null : a.map_index)))];
      if (indexes.length <= 1) {
        rows.push({key: t.task_code, label: t.task_code + (indexes[0] !== null && indexes[0] !== undefined ? ` [${indexes[0]}]` : ''), task: t, attempts});
      } else {
        for (const index of indexes) {
          rows.push({key: t.task_code, label: `${t.task_code} [${index}]`, task: t,
            attempts: attempts.filter((a) => (a.map_index ?? null) === index)});
        }
      }
    }
    return rows;
  }

  function timelineSection(run) {
    const rows = timelineRows(run);
    const box = el('div', {class: 'gantt', 'data-testid': 'gantt'});
    const block = section('Timeline', box);
    if (!rows.length) {
      append(box, el('p', {class: 'muted', 'data-testid': 'gantt-empty'}, 'This run has no task run: nothing to draw.'));
      return block;
    }
    const now = Date.now();
    const gates = Array.isArray(run.gate_decisions) ? run.gate_decisions : [];
    const live = run.status === 'IN-PROGRESS';
    const times = [ms(run.start_date), ms(run.end_date), ...gates.map((g) => ms(g.decided_at))];
    for (const row of rows) {
      for (const a of row.attempts) times.push(ms(a.started_at), ms(a.ended_at), ms(a.queued_at));
    }
    const known = times.filter((t) => t !== null);
    if (!known.length) {
      append(box, el('p', {class: 'muted', 'data-testid': 'gantt-empty'}, 'No attempt has a start time yet.'));
      return block;
    }
    const t0 = Math.min(...known);
    const t1 = Math.max(t0 + 1000, ...known, live ? now : t0);
    const width = chartWidth();
    const label = 190, right = 16, top = 26, rowH = 26, barH = 14;
    const plotW = width - label - right;
    const x = (t) => label + ((t - t0) / (t1 - t0)) * plotW;
    const allRows = [{key: null, label: 'Run', run: true, attempts: []}, ...rows];
    const height = top + allRows.length * rowH + 8;
    const root = svg('svg', {width, height, viewBox: `0 0 ${width} ${height}`, role: 'img',
      'aria-label': `Timeline of run ${run.pipeline_run_id}: a bar per attempt`, 'data-testid': 'gantt-svg'});

    // Time axis: gridlines and UTC clock labels.
    const step = STEPS.find((s) => (t1 - t0) / s <= 8) || STEPS[STEPS.length - 1];
    for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) {
      append(root,
        svg('line', {class: 'grid', x1: x(t), x2: x(t), y1: top - 4, y2: height - 8}),
        svg('text', {class: 'tick', x: x(t), y: top - 10, 'text-anchor': 'middle'}, clock(t, step)));
    }
    append(root, svg('text', {class: 'tick', x: 4, y: top - 10}, 'UTC'));

    allRows.forEach((row, n) => {
      const y = top + n * rowH;
      const mid = y + rowH / 2;
      const g = svg('g', {class: 'row', 'data-row': row.run ? 'run' : row.label});
      append(root, g);
      if (n % 2) append(g, svg('rect', {class: 'stripe', x: 0, y, width, height: rowH}));
      append(g, svg('text', {class: 'row-label', x: 4, y: mid + 4}, row.label));
      if (row.run) {
        const start = ms(run.start_date), end = ms(run.end_date) ?? (live ? now : null);
        if (start !== null) {
          append(g, svg('rect', {class: `run-bar ${statusClass(run.status)}`, x: x(start), y: mid - 4,
            width: Math.max(2, x(end ?? start) - x(start)), height: 8, rx: 2},
          svg('title', null, `Run ${run.pipeline_run_id}: ${run.status}, ${fmtTime(run.start_date)} – ${fmtTime(run.end_date)}`)));
        }
      }
      const attempts = [...row.attempts].sort((a, b) => a.attempt_number - b.attempt_number);
      if (!row.run && !attempts.length) {
        append(g, svg('text', {class: 'no-attempt', x: label + 4, y: mid + 4}, `${text(row.task.status)}: no attempt`));
      }
      // Before the first attempt the task waited (upstream tasks, its gate, a free worker): not recorded
      // apart, so drawn as one faint track from the run's start.
      const first = attempts.length ? ms(attempts[0].started_at) : null;
      const runStart = ms(run.start_date);
      if (first !== null && runStart !== null && first > runStart) {
        append(g, svg('line', {class: 'wait', x1: x(runStart), x2: x(first), y1: mid, y2: mid},
          svg('title', null, `${row.label}: no attempt yet for ${fmtDuration((first - runStart) / 1000)} ` +
            '(waiting for upstream tasks, its gate or a worker)')));
      }
      attempts.forEach((a, i) => {
        const start = ms(a.started_at);
        if (start === null) return;
        const queued = ms(a.queued_at);
        const parkedNow = a.status === 'QUEUED' && queued !== null;
        const end = parkedNow ? queued : (ms(a.ended_at) ?? now);
        const prev = i ? attempts[i - 1] : null;
        const prevEnd = prev ? ms(prev.ended_at) : null;
        if (prevEnd !== null && start >= prevEnd) {
          append(g, svg('line', {class: 'retry', x1: x(prevEnd), x2: x(start), y1: mid, y2: mid, 'data-testid': 'gantt-retry'},
            svg('title', null, `Retry: attempt ${a.attempt_number} started ${fmtDuration((start - prevEnd) / 1000)} after attempt ${prev.attempt_number} ended`)));
        }
        const w = Math.max(2, x(end) - x(start));
        const words = `Attempt ${a.attempt_number}${a.map_index !== null && a.map_index !== undefined ? ` (map index ${a.map_index})` : ''}: ` +
          `${a.status}, ${fmtTime(a.started_at)} – ${a.ended_at ? fmtTime(a.ended_at) : 'not ended'} ` +
          `(${fmtDuration((end - start) / 1000)})${a.error_message ? `\n${a.error_message}` : ''}`;
        append(g, svg('rect', {class: `attempt ${statusClass(a.status)}${a.ended_at || parkedNow ? '' : ' open'}`,
          x: x(start), y: mid - barH / 2, width: w, height: barH, rx: 2,
          'data-testid': 'gantt-attempt', 'data-status': a.status, 'data-attempt': a.attempt_number},
        svg('title', null, words)));
        if (w > 26) append(g, svg('text', {class: 'bar-label', x: x(start) + 4, y: mid + 4}, `#${a.attempt_number}`));
        if (parkedNow) {
          append(g, svg('rect', {class: 'parked', x: x(queued), y: mid - barH / 2, width: Math.max(2, x(live ? now : t1) - x(queued)),
            height: barH, 'data-testid': 'gantt-parked'},
          svg('title', null, `Parked since ${fmtTime(a.queued_at)}: Airflow rescheduled or deferred the try, no worker runs it`)));
        } else if (queued !== null) {
          append(g, svg('line', {class: 'parked-mark', x1: x(queued), x2: x(queued), y1: mid - barH / 2 - 3, y2: mid + barH / 2 + 3,
            'data-testid': 'gantt-parked'},
          svg('title', null, `Last parked at ${fmtTime(a.queued_at)} (rescheduled or deferred), taken over again later`)));
        }
      });
      // Gate decisions of this task (the run row: the pipeline's own dependencies).
      for (const d of gates.filter((d) => (row.run ? !d.task_code : d.task_code === row.key))) {
        const at = ms(d.decided_at);
        if (at === null) continue;
        const cx = x(at), r = 6;
        append(g, svg('path', {class: `gate ${statusClass(d.result)}`, 'data-testid': 'gantt-gate', 'data-result': d.result,
          d: `M${cx} ${mid - r} L${cx + r} ${mid} L${cx} ${mid + r} L${cx - r} ${mid} Z`},
        svg('title', null, `Gate ${d.result} at ${fmtTime(d.decided_at)}: ${gateSentence(d)}`)));
      }
    });
    const key = (cls, words) => el('span', {class: 'key'}, el('span', {class: `swatch ${cls}`}), words);
    append(box,
      el('div', {class: 'gantt-scroll'}, root),
      el('p', {class: 'gantt-legend small', 'data-testid': 'gantt-legend'},
        key('st-green', 'success'), key('st-red', 'failed, timed out, lost'), key('st-blue', 'running'),
        key('st-grey', 'cancelled (a skip)'), key('parked', 'parked (rescheduled or deferred)'),
        key('retry', 'retry gap'), key('wait', 'no attempt yet'), key('gate', 'gate decision'),
        el('span', {class: 'muted'}, ' Hover a bar for its times and error.')));
    return block;
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
