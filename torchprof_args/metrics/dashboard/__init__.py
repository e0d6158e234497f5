"""dashboard"""
