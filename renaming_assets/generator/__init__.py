"""World generator, treatments, request bodies and schedule (standard library only)."""

from renaming_assets.generator.plan import family_plan, generate_plan

__all__ = ["family_plan", "generate_plan"]
