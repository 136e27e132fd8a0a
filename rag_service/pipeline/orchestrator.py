"""The plan-and-execute orchestrator: one question in, a cited answer (or a clarification) out.

Planning runs first and in order: input guardrails, intent (with the conversation's earlier
turns), routing. The route then becomes a ``Plan``: a retrieval step per question part (they are
independent, so they run concurrently), a generation step that needs them all, an output check,
and persistence. The executor (executor.py) runs it: budgets, retries, fallbacks, events. The
fallbacks are the design's: an LLM failure or timeout -> extractive generation, an output check
that fails -> a repaired or extractive answer (the retriever itself covers reranker -> fused
order and semantic -> keyword).

Everything the orchestrator talks to is a Protocol (collaborators.py), so it is tested with
fakes as well as over HTTP.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rag_service.domain import (
    Candidate,
    Clarification,
    EvaluationReport,
    GeneratedAnswer,
    Intent,
    QueryRequest,
    QueryResult,
    RetrievalRequest,
    RetrievalResult,
    RouteDecision,
    no_such_collection,
)
from rag_service.domain.prompts import PromptChoice, assignment_unit
from rag_service.errors import NotFoundError, RagServiceError
from rag_service.pipeline.collaborators import (
    AnswerGenerator,
    CollectionCatalog,
    GuidelineSource,
    PromptSource,
    QueryHistory,
    Retrieves,
)
from rag_service.pipeline.config import PipelineConfig
from rag_service.pipeline.evaluation import AnswerEvaluator, Graded, contexts_of
from rag_service.pipeline.executor import EventSink, Executor, Fallback, Plan, RetryPolicy, Step, no_events
from rag_service.pipeline.generation.declines import confirm_decline
from rag_service.pipeline.generation.extractive import ExtractiveGenerator
from rag_service.pipeline.guardrails import InputCheck, OutputRejectedError, check_input, check_output
from rag_service.pipeline.intent import IntentParser
from rag_service.pipeline.intent_llm import RULES_UNSURE_BELOW, refine_with_llm
from rag_service.pipeline.late_grading import LateGrading
from rag_service.pipeline.reporting import KeptEvents, QueryReporting
from rag_service.pipeline.results import (
    context_log,
    fill_answer,
    hold,
    intersect_dates,
    log_entry,
    lowest,
    merge_contexts,
    question_hash,
    retrieval_scope,
    retrieval_summary,
)
from rag_service.pipeline.router import route
from rag_service.providers.embeddings import TokenEncoder
from rag_service.providers.llm import LLM, metered
from rag_service.providers.reader import SpanReader
from rag_service.providers.syntax import SyntaxParser
from rag_service.scoring.evidence import ScoringInput
from rag_service.text.citations import cited_numbers, drop_citations, verify_claims

log = logging.getLogger(__name__)

_DECLINE = ("I answer questions about the documents in this collection. Ask me something about them, "
            "for example what a document says about a topic.")
# An LLM that fails or times out leaves this share of the generation budget to the extractive fallback.
_FALLBACK_SHARE = 0.2


@dataclass
class Grading:
    """What the evaluate step hands on: to persistence (grades, the chunks read) and to the LLM
    grading after delivery (its input)."""

    graded: Graded | None = None
    context: list[dict[str, Any]] = field(default_factory=list)
    later: ScoringInput | None = None


class QueryPipeline:
    def __init__(self, *, retriever: Retrieves, collections: CollectionCatalog, guidelines: GuidelineSource,
                 query_log: QueryHistory, generator: AnswerGenerator | None = None,
                 parser: IntentParser | None = None, config: PipelineConfig | None = None,
                 intent_llm: LLM | None = None, evaluator: AnswerEvaluator | None = None,
                 prompts: PromptSource | None = None, reporting: QueryReporting | None = None,
                 token_encoder: TokenEncoder | None = None, syntax_parser: SyntaxParser | None = None,
                 span_reader: SpanReader | None = None) -> None:
        """``generator`` answers (default: extractive); when it is not the extractive one, a
        failure of it falls back to extractive answers. ``prompts`` chooses the version of the
        generator's prompt each query uses (None: the generator's shipped default). ``reporting``: who
        hears of each finished query (metrics, stored traces, Langfuse). ``token_encoder``, ``syntax_parser``,
        ``span_reader``: see ExtractiveGenerator's ``token_encoder``, ``parser`` and ``reader``."""
        self._retriever = retriever
        self._collections = collections
        self._guidelines = guidelines
        self._log = query_log
        self._parser = parser or IntentParser()
        self.config = config or PipelineConfig()
        self._extractive = ExtractiveGenerator(self.config.abstain_below, token_encoder=token_encoder,
                                               parser=syntax_parser, reader=span_reader)
        self._generator: AnswerGenerator = generator or self._extractive
        self._intent_llm = intent_llm  # asked only when the rules are unsure of the query type
        self._prompts = prompts
        self._reporting = reporting or QueryReporting()
        self.evaluator = evaluator or AnswerEvaluator()
        self._late = LateGrading(self.evaluator, query_log, self._reporting,
                                 budget_s=self.config.judge_budget_s + self.config.evaluate_margin_s,
                                 max_running=self.config.max_late_gradings)

    async def run(self, request: QueryRequest, emit: EventSink | None = None, now: datetime | None = None,
                  api_key_id: uuid.UUID | None = None) -> QueryResult:
        started = time.perf_counter()
        events = KeptEvents(emit or no_events)
        run = Executor(emit=events, retry=RetryPolicy(attempts=self.config.retries))
        now = now or datetime.now(UTC)

        # --- planning: guardrails, intent, route (each depends on the one before) ------------
        async def guard() -> InputCheck:
            return check_input(request.question)

        checked: InputCheck = await run.run_step(Step("guardrails", "guardrails", guard))
        retrieval_request = retrieval_scope(request, checked.text)  # filters/principals checked early (422)
        if not await self._collections.collection_exists(request.collection):
            raise NotFoundError(no_such_collection(request.collection))

        async def parse() -> Intent:
            return await self._parse(request, checked.text, now)

        intent: Intent = await run.run_step(Step("intent", "intent", parse, retry=True))
        await run.emit("intent", intent.model_dump(mode="json"))

        async def decide() -> RouteDecision:
            version, guidelines = await self._guidelines.current()
            return route(intent, guidelines, version, strategies=self.config.strategies)

        decision: RouteDecision = await run.run_step(Step("route", "route", decide, retry=True))
        await run.emit("route", decision.model_dump(mode="json"))
        guard_record = {"injection": list(checked.injection), "pii": sorted({p.kind for p in checked.pii}),
                        "stripped_characters": checked.stripped_characters}
        result = QueryResult(query_id=uuid.uuid4(), conversation_id=request.conversation_id, outcome="answered",
                             question=intent.question, answer=None, intent=intent, route=decision,
                             guardrails=guard_record, steps=[], timings_ms={})

        grading = Grading()

        async def persist() -> None:
            # The stored total is the latency up to persistence (experiments compare it per variant).
            timings = {**run.timings_ms(), "total": round((time.perf_counter() - started) * 1000, 2)}
            entry = log_entry(request, checked.masked, result, timings, api_key_id=api_key_id,
                              graded=grading.graded, context=grading.context)
            await self._log.record(entry)

        # A held answer must be stored (the caller is given its review id); otherwise a failure to
        # log does not cost the caller the answer.
        persist_step = Step("persist", "persist", persist, budget_s=self.config.persist_budget_s,
                            soft=not self.evaluator.holds)
        if decision.route.action != "answer":
            if decision.route.action == "clarify":
                questions = intent.clarifications or ["Could you say more precisely what you are asking about?"]
                result.outcome = "clarification"
                result.clarification = Clarification(questions=questions, missing=intent.missing)
            else:
                result.outcome, result.answer = "declined", _DECLINE
            plan = Plan((persist_step,))
        else:
            unit = assignment_unit(request.conversation_id, str(api_key_id) if api_key_id else None,
                                   str(result.query_id))
            plan = self._answer_plan(run, intent, decision, retrieval_request, result, bool(checked.injection),
                                     persist_step, grading, now, unit)
        await run.emit("plan", {"steps": plan.describe()})
        await run.run(plan)
        graded = grading.graded
        if graded is not None and graded.verdict.hold and graded.verdict.needs_review:
            hold(result, graded.verdict.tier)
        if any(r.kind == "persist" and r.status == "failed" for r in run.records):
            result.review_id = None  # nothing was queued: do not hand out an id that leads nowhere
        result.steps = run.records
        result.timings_ms = run.timings_ms()
        result.timings_ms["total"] = round((time.perf_counter() - started) * 1000, 2)
        await self._reporting.finished(request, checked.masked, result, events, api_key_id)
        if grading.later is not None and graded is not None:  # the grades wait for the trace write they update
            prompt = result.prompt or {}
            self._late.start(grading.later, graded, query_id=result.query_id, collection=request.collection,
                             question_hash=question_hash(checked.masked), prompt_name=prompt.get("name"),
                             prompt_version=prompt.get("version"))
        return result

    async def _choose_prompt(self, name: str, unit: str) -> PromptChoice | None:
        """The prompt version to answer with; a failure to read it must not cost the answer (the
        generator's shipped default serves)."""
        if self._prompts is None:
            return None
        try:
            return await self._prompts.choose(name, unit)
        except RagServiceError as exc:
            log.warning("could not read the %s prompt's version (%s); using the shipped default", name, exc)
            return None

    async def drain(self, timeout_s: float | None = None) -> None:
        """Wait for LLM gradings and trace writes still running after delivery (shutdown, one-shot
        CLI runs); ``timeout_s`` for each."""
        await self._late.drain(timeout_s)  # first: their grades update the traces
        await self._reporting.drain(timeout_s)

    async def _parse(self, request: QueryRequest, question: str, now: datetime) -> Intent:
        turns = (await self._log.turns(request.conversation_id, request.collection, request.principals,
                                       self.config.history_turns)
                 if request.conversation_id else [])
        intent = self._parser.parse(question, now, turns)
        if self._intent_llm is not None and intent.confidence < RULES_UNSURE_BELOW:
            try:
                intent = await asyncio.wait_for(refine_with_llm(intent, self._intent_llm),
                                                self.config.intent_llm_budget_s)
            except (RagServiceError, TimeoutError) as exc:
                log.warning("LLM intent refinement failed; keeping the rules' reading: %s", exc)
        return intent

    # --- the plan: retrieve each part concurrently, then generate, check, persist ------------

    def _answer_plan(self, run: Executor, intent: Intent, decision: RouteDecision, scope: RetrievalRequest,
                     result: QueryResult, injection: bool, persist: Step, grading: Grading,
                     now: datetime, unit: str) -> Plan:
        parts = [intent.question]
        if decision.route.split_parts and len(intent.sub_questions) >= 2:
            parts = list(intent.sub_questions)
        flt = scope.filter
        time_scoped = decision.route.use_time_filter and bool(intent.time_ranges)
        if time_scoped:
            flt = flt.model_copy(update=intersect_dates(flt.date_from, flt.date_to, intent.time_ranges[0]))
        top_k = decision.route.top_k
        per_part = max(2, -(-top_k // len(parts)))
        steps: list[Step] = []
        for i, part in enumerate(parts):
            request = RetrievalRequest(query=part[:2000], filter=flt, top_k=per_part if len(parts) > 1 else top_k,
                                       strategies=tuple(decision.route.strategies), rerank=decision.route.rerank,
                                       adaptive=decision.route.adaptive, candidates=self.config.candidates,
                                       # A time range keeps out-of-range documents unless nothing is
                                       # dated in it (then the loop searches all, and records it).
                                       relax_filters="when_empty" if time_scoped else "when_few")
            steps.append(Step(f"retrieve-{i + 1}", "retrieve", functools.partial(self._retriever.retrieve, request),
                              budget_s=self.config.retrieve_budget_s, retry=True))
        retrieve_ids = tuple(s.id for s in steps)
        context: list[Candidate] = []
        experiment: list[PromptChoice] = []  # the experiment's choice, when one chose the prompt
        tokens: dict[str, int] = {}  # the generation's LLM tokens, failed attempts included

        def retrievals() -> list[RetrievalResult]:
            return [run.results[i] for i in retrieve_ids]

        streamed = False

        # In hold mode an answer may be kept from the caller: nothing of it streams out early.
        holds = self.evaluator.holds

        async def on_token(text: str) -> None:
            nonlocal streamed
            streamed = True
            if not holds:
                await run.emit("token", {"text": text})

        async def generate() -> GeneratedAnswer:
            context[:] = merge_contexts([r.candidates for r in retrievals()], top_k)
            confidence = lowest(r.confidence for r in retrievals())
            await run.emit("retrieval", {"results": [
                {"n": n, "chunk_id": str(c.hit.chunk_id), "source_uri": c.hit.source_uri, "title": c.hit.title,
                 "score": c.rerank_score if c.rerank_score is not None else c.fused_score, "ranks": c.ranks}
                for n, c in enumerate(context, start=1)], "confidence": confidence})
            # With nothing retrieved there is nothing for an LLM to read: the extractive generator says so.
            generator = self._generator if context else self._extractive
            chosen = await self._choose_prompt(generator.prompt_name, unit)
            with metered(tokens):
                answer = await generator.generate(intent.question, intent.sub_questions, context,
                                                  tier=decision.route.tier, injection_flagged=injection,
                                                  retrieval_confidence=confidence, on_token=on_token,
                                                  prompt=chosen.version if chosen else None)
            if chosen is not None and chosen.experiment_id is not None:
                experiment[:] = [chosen]
            if generator is not self._extractive and not answer.answered:
                _, assessment = await self._extractive.assessed(intent.question, intent.sub_questions, context)
                answer = confirm_decline(answer, assessment, self._extractive.abstain_below)
            return answer

        async def answer_extractively(error: BaseException) -> Fallback:
            why = str(error) or ("timed out" if isinstance(error, TimeoutError) else type(error).__name__)
            reason = f"LLM generation failed ({why}); answered extractively"
            if streamed and not holds:  # the caller saw part of the failed answer: tell it to discard that
                await run.emit("token.reset", {"reason": reason})
            answer = await self._extractive.generate(intent.question, intent.sub_questions, context,
                                                     retrieval_confidence=lowest(r.confidence for r in retrievals()),
                                                     on_token=on_token)
            return Fallback(answer.model_copy(update={"fallback_reason": reason}), reason)

        has_fallback = self._generator is not self._extractive
        budget = self.config.generate_budget_s
        steps.append(Step("generate", "generate", generate,
                          depends_on=retrieve_ids,
                          budget_s=budget * (1 - _FALLBACK_SHARE) if has_fallback else budget,
                          fallback=answer_extractively if has_fallback else None,
                          fallback_on=(RagServiceError, TimeoutError), fallback_budget_s=budget * _FALLBACK_SHARE))

        async def finish(answer: GeneratedAnswer) -> GeneratedAnswer:
            # The result is complete here, so persistence (next) stores what the caller gets.
            fill_answer(result, answer)
            result.llm_tokens = dict(tokens) if tokens else None
            chosen = experiment[0] if experiment else None
            if chosen is not None:
                # Every answer the experiment assigned counts in its arm, a fallback's too (intention
                # to treat): a candidate whose LLM replies fail must not look as good as its successes.
                result.prompt = {**(result.prompt or {}), "experiment_id": str(chosen.experiment_id),
                                 "variant": chosen.variant, "unit": unit}
            result.retrieval = retrieval_summary(parts, retrievals())
            if not holds:
                for citation in answer.citations:
                    await run.emit("citation", citation.model_dump(mode="json"))
            return answer

        async def verify() -> GeneratedAnswer | Fallback:
            answer: GeneratedAnswer = run.results["generate"]
            quoted = answer.generator == "extractive"
            # An extractive answer's citations are known; its text quotes the sources, whose own
            # bracketed references ("... as shown [14].") are not citations.
            cited = [c.n for c in answer.citations] if quoted else cited_numbers(answer.answer)
            check = check_output(answer.answer, cited, len(context), quoted=quoted)
            if not check.ok:
                raise OutputRejectedError(check.problems, check.unresolved_citations)
            if answer.fallback_reason:
                # What the caller gets is a fallback answer: this step says so too.
                return Fallback(await finish(answer), answer.fallback_reason)
            return await finish(answer)

        async def repair(error: BaseException) -> Fallback:
            """Output guardrails: an LLM answer showing injection phrasing is replaced by an
            extractive one; citations that resolve to nothing are dropped."""
            assert isinstance(error, OutputRejectedError)
            answer: GeneratedAnswer = run.results["generate"]
            reason = "; ".join(error.problems)
            if any("injection" in p for p in error.problems) and answer.generator == "llm":
                replacement = await self._extractive.generate(intent.question, intent.sub_questions, context)
            else:
                text = drop_citations(answer.answer, error.unresolved)
                replacement = answer.model_copy(update={
                    "answer": text, "claims": verify_claims(text, [c.hit.text for c in context])})
            return Fallback(await finish(replacement.model_copy(update={"fallback_reason": reason})), reason)

        steps.append(Step("verify", "verify", verify, depends_on=("generate",), fallback=repair,
                          fallback_on=(OutputRejectedError,)))

        async def evaluate() -> EvaluationReport | None:
            answer: GeneratedAnswer = run.results["verify"]
            if not answer.answered:
                return None  # "the documents do not answer" has no claims to grade, nothing to review
            inp, graded = await self.evaluator.local(
                question=intent.question, answer=answer.answer, contexts=contexts_of(context),
                parts=intent.sub_questions, claims=answer.claims, now=now)
            if holds and self.evaluator.llm_grader is not None:
                # The gate decides on the best grades there are: the judge's, when it answers in time.
                try:
                    combined = await asyncio.wait_for(self.evaluator.with_llm(inp, graded),
                                                      self.config.judge_budget_s)
                    graded = combined[0] if combined else graded
                except TimeoutError:
                    log.warning("LLM grading took over %.0f s; the gate decides on the local grades",
                                self.config.judge_budget_s)
            elif self.evaluator.llm_grader is not None:
                grading.later = inp
            grading.graded = graded
            grading.context = context_log(context)
            report = graded.report
            result.evaluation = report
            if graded.verdict.needs_review:
                result.review_id = uuid.uuid4()
            if not graded.verdict.hold:  # a held answer's grades quote it: the caller sees them redacted
                await run.emit("evaluation", report.model_dump(mode="json"))
            return report

        # Grading never costs the caller an answer, except in hold mode, where the gate needs it.
        steps.append(Step("evaluate", "evaluate", evaluate, depends_on=("verify",), soft=not holds,
                          budget_s=self.config.judge_budget_s + self.config.evaluate_margin_s))
        steps.append(dataclasses.replace(persist, depends_on=("evaluate",)))
        return Plan(tuple(steps))

