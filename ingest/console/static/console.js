// taskhook console: the live parts of the pages, and the copy buttons.
//
// Loaded from the console's own origin (the Content-Security-Policy allows no
// inline script). Everything it writes into a page is either text
// (textContent) or HTML the server rendered, escaped, for that same page.
"use strict";

(function () {
  const TASK_EVENTS = ["task.created", "task.archived", "task.deleted", "task.identity_released"];
  const MAX_LIVE_EVENTS = 50;

  function setState(text) {
    const state = document.getElementById("live-state");
    if (state) state.textContent = text;
  }

  // Fetch this page again and put the server's fresh rendering of each
  // element named in `ids` in place of the one shown.
  async function refreshFrom(url, ids) {
    const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "text/html" } });
    if (!response.ok) return;
    const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
    for (const id of ids) {
      const now = document.getElementById(id);
      const next = fresh.getElementById(id);
      if (now && next) now.replaceWith(document.importNode(next, true));
    }
  }

  // Run `work` at most once per `ms`, however often it is asked for.
  function throttled(work, ms) {
    let timer = null;
    return function () {
      if (timer) return;
      timer = setTimeout(function () {
        timer = null;
        work();
      }, ms);
    };
  }

  // --- copy buttons -------------------------------------------------------------
  function copyButtons() {
    for (const button of document.querySelectorAll("button.copy[data-copy]")) {
      button.addEventListener("click", async function () {
        const source = document.getElementById(button.dataset.copy);
        if (!source) return;
        const text = source.textContent.trim();
        try {
          await navigator.clipboard.writeText(text);
        } catch (_) {
          const range = document.createRange();
          range.selectNodeContents(source);
          const selection = window.getSelection();
          selection.removeAllRanges();
          selection.addRange(range);
          document.execCommand("copy");
        }
        button.textContent = "Copied";
        setTimeout(function () { button.textContent = "Copy"; }, 1500);
      });
    }
  }

  // --- the overview's chart -------------------------------------------------------
  const STATUS_COLOURS = {
    done: "#2e7d32", ignored: "#9e9e9e", queued: "#1565c0", processing: "#6a1b9a",
    needs_operator: "#ef6c00", dead: "#c62828", replay: "#00838f", mismatch: "#ad1457",
  };

  // A time as the rest of the console and the CLI write it: 24-hour UTC
  // ("2026-12-05 18:21"). uPlot's own formats are 12-hour ("6:21pm").
  function utcMinute(seconds) {
    return new Date(seconds * 1000).toISOString().slice(0, 16).replace("T", " ");
  }

  function chart() {
    const target = document.getElementById("chart");
    const data = document.getElementById("chart-data");
    if (!target || !data || typeof window.uPlot !== "function") return;
    const rate = JSON.parse(data.textContent);
    const statuses = Object.keys(rate.counts);
    const series = [{
      label: "minute (UTC)",
      value: function (u, seconds) { return seconds == null ? "--" : utcMinute(seconds) + " UTC"; },
    }].concat(statuses.map(function (status) {
      return { label: status, stroke: STATUS_COLOURS[status] || "#455a64", width: 2 };
    }));
    const columns = [rate.minutes].concat(statuses.map(function (status) { return rate.counts[status]; }));
    const width = Math.max(320, target.clientWidth || 800);
    target.replaceChildren();
    // The time axis: "18:20" on each tick, the date too on the first tick of a day.
    const timeAxis = {
      values: function (u, splits) {
        return splits.map(function (seconds, index) {
          const when = utcMinute(seconds);
          const newDay = index === 0 || utcMinute(splits[index - 1]).slice(0, 10) !== when.slice(0, 10);
          return newDay ? when.slice(11) + "\n" + when.slice(0, 10) : when.slice(11);
        });
      },
    };
    // Kept on its element, where a test reads what the time axis shows.
    target.uplot = new window.uPlot({ width: width, height: 260, series: series, scales: { x: { time: true } },
                                      axes: [timeAxis, { label: "deliveries / min" }],
                                      // Ticks on UTC's hours and minutes, not the browser's zone.
                                      tzDate: function (ts) { return window.uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"); } },
                                    columns, target);
    if (!statuses.length) {
      const empty = document.createElement("p");
      empty.className = "hint";
      empty.textContent = "No deliveries in this window.";
      target.append(empty);
    }
  }

  // --- the overview's task events, live -------------------------------------------------
  function liveEvents() {
    const list = document.getElementById("live-events");
    if (!list) return;
    const refreshCards = throttled(function () {
      refreshFrom(window.location.href, ["backlog", "needs-operator", "dead", "status-counts", "workspace-backlogs"]);
    }, 2000);
    const streams = document.querySelectorAll("#event-streams [data-events-url]");
    for (const stream of streams) {
      const source = new EventSource(stream.dataset.eventsUrl);
      source.onopen = function () { setState("Live: new task events appear here."); };
      source.onerror = function () { setState("Reconnecting…"); };
      for (const type of TASK_EVENTS) {
        source.addEventListener(type, function (message) {
          const event = JSON.parse(message.data);
          const item = document.createElement("li");
          item.dataset.type = event.type;
          const when = document.createElement("time");
          when.textContent = event.occurred_at.replace("T", " ").slice(0, 19) + " UTC";
          const what = document.createElement("strong");
          what.textContent = " " + event.type + " ";
          const detail = document.createElement("span");
          detail.textContent = stream.dataset.workspace + " task " + event.task_id +
            (event.external_id ? " " + event.external_id : "");
          item.append(when, what, detail);
          list.prepend(item);
          while (list.children.length > MAX_LIVE_EVENTS) list.lastElementChild.remove();
          refreshCards();
        });
      }
    }
  }

  // --- the deliveries table, live ------------------------------------------------------
  function liveDeliveries() {
    const table = document.getElementById("deliveries");
    if (!table || !table.dataset.liveUrl) return;
    const rowsUrl = new URL(window.location.href);
    rowsUrl.searchParams.set("fragment", "rows");
    const refresh = throttled(async function () {
      const response = await fetch(rowsUrl, { credentials: "same-origin" });
      if (!response.ok) return;
      const fresh = new DOMParser().parseFromString("<table>" + (await response.text()) + "</table>", "text/html");
      const rows = fresh.getElementById("delivery-rows");
      const shown = document.getElementById("delivery-rows");
      if (rows && shown) shown.replaceWith(document.importNode(rows, true));
    }, 500);
    const source = new EventSource(table.dataset.liveUrl);
    source.onopen = function () { setState("Live: new deliveries and changes appear here."); };
    source.onerror = function () { setState("Reconnecting…"); };
    source.addEventListener("delivery", refresh);
  }

  document.addEventListener("DOMContentLoaded", function () {
    copyButtons();
    chart();
    liveEvents();
    liveDeliveries();
  });
})();
